"""bisect's compile-and-run session: one attempt compiles a program as `llmc compile` does (and,
where the target runs here, runs it and compares with eager PyTorch), and records how it failed.

Two attempts "fail the same way" when their error signatures match (`error_signature`: the first
`error:` line without locations and SSA names). The session holds what is fixed for one bisection:
the resolved target and flags, the scratch folder, the inputs and every node's eager value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from llmc.compiler import diff_metrics, export, iree, lower
from llmc.compiler.progress import Phases
from llmc.errors import CompileError, LlmcError


@dataclasses.dataclass
class Attempt:
    index: int
    what: str  # "whole model", "prefix 12/50", "one op", "cut at culprit", "check command.sh"
    outcome: str  # "ok", "fails", "fails differently", "drifts"
    seconds: float
    detail: str = ""


@dataclasses.dataclass
class Failure:
    """How one compile (or run) failed: enough to compare two failures and to write a reproducer."""

    kind: str  # "compile" or "drift"
    stage: str  # "import" (torch-mlir), "passes", "iree-compile", "run"
    signature: str  # normalised first error line: what "fails the same way" compares
    first_line: str  # the upstream error's first line as printed
    diagnostics: str = ""
    mlir: str | None = None  # the IR handed to iree-compile (None when the import failed)
    flags: tuple[str, ...] = ()
    outputs: list = dataclasses.field(default_factory=list)  # drift: OutputDiff per output


# ---------------------------------------------------------------------------------------------
# Error signatures: what "fails the same way" means


def error_signature(text: str) -> tuple[str, str]:
    """(signature, first line) of a diagnostics text: the first `error:` line without its location,
    with SSA names and the printed operation removed, so two compiles of different graphs that hit
    the same bug compare equal. Crashes without an `error:` line use the LLVM/assert line."""
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    first = next((l for l in lines if "error:" in l), None)
    if first is None:
        first = next(
            (l for l in lines if re.search(r"LLVM ERROR|Assertion|Segmentation fault|Aborted|Please report", l)),
            lines[0] if lines else "(no diagnostics)",
        )
        msg = first
    else:
        msg = first.split("error:", 1)[1].strip()
    sig = re.split(r":\s*%[\w#:]+\s*=|see current operation", msg)[0]
    sig = re.sub(r"%[\w#]+", "%_", sig).strip().rstrip(":").strip()
    named = re.search(r'name = "([^"]+)"', first)
    if "torch.operator" in msg and named:
        sig += f" ({named.group(1)})"
    return sig, _strip_location(first)


def _strip_location(line: str) -> str:
    # "/tmp/llmc-compile-xyz/input.mlir:6:10: error: msg" -> "msg" (the path is a temp file)
    return line.split("error:", 1)[1].strip() if "error:" in line else line.strip()


def error_signature_all(text: str) -> set[str]:
    """Signatures of every error line in `text` (torch-mlir prints the failing pass's errors after notes)."""
    out = set()
    for line in text.splitlines():
        if "error:" in line:
            out.add(error_signature(line)[0])
    return out


# ---------------------------------------------------------------------------------------------
# Compiling and running one attempt


class Session:
    """Everything fixed for one bisection: target, flags, scratch folder, inputs, eager values."""

    def __init__(self, program, resolved, scratch: Path, progress, inputs, eager):
        self.program = program
        self.resolved = resolved
        self.dtype = resolved.dtype
        self.scratch = scratch
        self.progress = progress
        self.inputs = inputs  # (args, kwargs) or None when the target does not run here
        self.eager = eager  # node name -> eager value, or None
        self.attempts: list[Attempt] = []
        self.expected: Failure | None = None

    def log(self, text: str):
        if self.progress is not None:
            try:
                self.progress.write(f"llmc bisect: {text}\n")
                self.progress.flush()
            except (ValueError, OSError):
                pass

    def attempt(self, what: str, program, strip_prefix: str, compare: list[str] | None) -> Failure | None:
        """Compile `program` (and, when `compare` names its outputs' eager nodes, run it and compare)."""
        i = len(self.attempts) + 1
        start = time.perf_counter()
        failure = self._compile_and_check(program, strip_prefix, compare, self.scratch / f"attempt-{i:02d}")
        seconds = time.perf_counter() - start
        if failure is None:
            outcome = "ok"
        elif self.expected is None or failure.signature == self.expected.signature:
            outcome = "fails" if failure.kind == "compile" else "drifts"
        else:
            outcome = "fails differently"
        detail = "" if failure is None else failure.first_line
        self.attempts.append(Attempt(i, what, outcome, seconds, detail))
        self.log(f"attempt {i}: {what}: {outcome} ({seconds:.1f}s){': ' + short(detail) if detail else ''}")
        return failure

    def _compile_and_check(self, program, strip_prefix, compare, work: Path) -> Failure | None:
        """Lower `program` through compiler/lower.py (as `llmc compile` does; its graph passes already
        ran on the whole program) and classify a failure by stage: import, passes, iree-compile."""
        work.mkdir(parents=True)
        resolved = self.resolved
        flags = tuple(resolved.iree_flags)
        entry = lower.Entry(export.Exported(program, strip_prefix), "main")
        printed: list[str] = []
        try:
            # torch-mlir prints its diagnostics on fd 2 rather than into the exception: keep them.
            with _captured_fd2(printed):
                lowered = lower.lower_module([entry], resolved, graph_passes=False)
        except CompileError as e:
            text = "".join(printed) + "\n" + str(e)
            sig, first = error_signature(text)
            return Failure("compile", "import", sig, first, text, None, flags)
        except LlmcError as e:
            sig, first = error_signature(str(e))
            return Failure("compile", "passes", sig, first, str(e), None, flags)
        flags = tuple(lower.compile_flags(lowered.target, lowered.mlir))
        vmfb = work / "m.vmfb"
        run_here = compare is not None and self.inputs is not None
        try:
            if run_here:  # the whole trio: parameters, module, manifest, as the runtime loads them
                lower.write_artifact(lowered, vmfb, source={"kind": "bisect attempt"}, phases=Phases(quiet=True), repro_dir=work / "repro")
            else:
                iree.compile_mlir(lowered.mlir, vmfb, list(flags), repro_dir=work / "repro", target_name=resolved.name)
        except CompileError as e:
            diagnostics = e.diagnostics or str(e)
            sig, first = error_signature(diagnostics)
            if sig == "(no diagnostics)":
                sig = first = str(e).splitlines()[0]
            return Failure("compile", "iree-compile", sig, first, diagnostics, lowered.mlir, flags)
        if not run_here:
            return None
        return self._run_and_compare(vmfb, compare, lowered.mlir, flags)

    def _run_and_compare(self, vmfb: Path, compare: list[str], mlir, flags) -> Failure | None:
        from llmc.runtime import load

        args, kwargs = self.inputs
        mod = load(vmfb)
        try:
            got = diff_metrics.tensor_leaves(mod(*args, **kwargs))
        except LlmcError as e:
            first = str(e).splitlines()[0]
            return Failure("drift", "run", "run failed: " + first, first, str(e), mlir, flags)
        finally:
            del mod
        if len(got) != len(compare):
            first = f"the module returned {len(got)} outputs, eager PyTorch {len(compare)}"
            return Failure("drift", "run", first, first, first, mlir, flags)
        tol = diff_metrics.TOLERANCES[self.dtype]
        results = [diff_metrics.compare(name, g, self.eager[name], tol) for name, g in zip(compare, got)]
        bad = [r for r in results if not r.passed]
        if not bad:
            return None
        worst = max(bad, key=lambda r: r.max_rel)
        first = f"{worst.name} differs from eager PyTorch: {worst.reason} (tolerance profile {self.dtype})"
        return Failure("drift", "run", "drift", first, "\n".join(str(r.as_dict()) for r in results), mlir, flags, results)


@contextlib.contextmanager
def _captured_fd2(into: list[str]):
    """Redirect file descriptor 2 (what C++ code writes to) into `into` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            into.append(tmp.read().decode(errors="replace"))


def short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def eager_values(program: torch.export.ExportedProgram, args, kwargs) -> dict[str, object]:
    """Every node's eager value (by node name) for one run of the program on (args, kwargs)."""
    from torch.export.graph_signature import InputKind

    import torch.utils._pytree as pytree

    user = iter(pytree.tree_leaves((tuple(args), dict(kwargs))))
    bound = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            bound.append(next(user))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            bound.append(program.state_dict[spec.target] if spec.target in program.state_dict else program.constants[spec.target])
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            bound.append(program.constants[spec.target])
        else:
            bound.append(None)
    values: dict[str, object] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = out
            return out

    with torch.no_grad():
        Recorder(program.graph_module).run(*bound)
    return values
