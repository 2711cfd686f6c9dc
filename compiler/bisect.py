"""llmc bisect: from a model that iree-compile rejects (or that drifts from eager) to a one-op reproducer.

The search, in order:
1. Compile the whole model exactly as `llmc compile` does (same export, importer with external
   parameters, passes and iree-compile flags). On a target that runs here, also run it and compare
   with eager PyTorch against `diff.TOLERANCES[dtype]`. Compiles and matches: done (status "ok").
2. Binary search on the prefix length over the graph's ops in topological order. The prefix of
   length k keeps the first k ops and returns every value of theirs that the rest of the graph
   uses, so every op in it stays live; the failure is monotone in k, and about log2(ops) compiles
   find the first op whose presence makes the compile fail with the *same* error (or drift).
3. Reduce to one op: a graph holding just the culprit, its inputs turned into graph inputs with
   the shapes and dtypes of `node.meta['val']`. If that alone doesn't fail the same way (a failure
   that needs its neighbours), the smallest failing prefix is kept as the reproducer instead.
4. Write the reproducer folder: `repro.mlir` (the torch-dialect IR llmc hands iree-compile),
   `repro.py` (a torch snippet that rebuilds the one-op module and exports it), `command.sh` (the
   exact iree-compile command; for drift, also the iree-run-module call and the comparison) and
   `stderr.txt`; then run command.sh once and check it fails the same way.

Every compile counts as an attempt; each one prints a progress line on stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from llmc.compiler import artifacts, diff, export, importer, iree, pipeline, targets
from llmc.errors import CompileError, LlmcError, UsageError

# ---------------------------------------------------------------------------------------------
# Results


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


@dataclasses.dataclass
class Culprit:
    node: str
    op: str
    position: int  # 1-based index among the graph's ops
    ops_total: int
    module_path: str
    module_type: str
    source: str  # file:line: code (the innermost frame outside torch)
    inputs: list  # [{"shape": [...], "dtype": "float32"}]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class BisectReport:
    status: str  # "ok", "compile-error", "drift"
    model: str
    target: str
    dtype: str
    arch: str
    ops_total: int
    attempts: list[Attempt]
    seconds: float
    failure: Failure | None = None
    culprit: Culprit | None = None
    reproducer_kind: str | None = None  # "one op", "cut at culprit", "prefix", "whole model"
    reproducer_dir: Path | None = None
    command: str | None = None
    reproduced: bool | None = None  # command.sh checked and failed the same way
    compared: bool = False  # outputs were compared with eager (the target runs here)

    @property
    def compile_attempts(self) -> int:
        """Compiles run: every attempt, the check of command.sh included."""
        return len(self.attempts)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "ok" else 1

    def as_dict(self) -> dict:
        f = self.failure
        return {
            "format": "llmc-bisect/1",
            "status": self.status,
            "model": self.model,
            "target": self.target,
            "dtype": self.dtype,
            "arch": self.arch,
            "ops_total": self.ops_total,
            "compile_attempts": self.compile_attempts,
            "seconds": round(self.seconds, 2),
            "compared_with_eager": self.compared,
            "error": None
            if f is None
            else {
                "kind": f.kind,
                "stage": f.stage,
                "first_line": f.first_line,
                "signature": f.signature,
                "outputs": [o.as_dict() for o in f.outputs],
            },
            "culprit": self.culprit.as_dict() if self.culprit else None,
            "reproducer": None
            if self.reproducer_dir is None
            else {
                "kind": self.reproducer_kind,
                "dir": str(self.reproducer_dir),
                "files": sorted(p.name for p in self.reproducer_dir.iterdir() if p.is_file()),
                "command": self.command,
                "reproduced": self.reproduced,
            },
            "attempts": [dataclasses.asdict(a) for a in self.attempts],
        }

    def summary(self) -> str:
        """The human-readable report (what `llmc bisect` prints on stdout)."""
        where = f"{self.target}/{self.dtype}"
        n = self.compile_attempts
        if self.status == "ok":
            how = "matches eager PyTorch within the " + self.dtype + " tolerance" if self.compared else "compiles (this target does not run here: not compared)"
            return f"ok: {self.model} compiles for {where} and {how}; nothing to bisect ({n} compile attempt{'s' * (n != 1)}, {self.seconds:.1f}s)"
        f = self.failure
        stage = {"import": "in torch-mlir's import", "passes": "in llmc's passes", "iree-compile": "in iree-compile"}
        what = f"fails to compile {stage.get(f.stage, '')}".strip() if f.kind == "compile" else "drifts from eager PyTorch"
        lines = [f"FAIL: {self.model} {what} for {where}"]
        lines.append(f"  error:      {f.first_line}")
        if f.kind == "drift":
            for o in f.outputs:
                if not o.passed:
                    lines.append(f"              {o.name}: {o.reason}")
        c = self.culprit
        if c is not None:
            lines.append(f"  culprit:    {c.op} (node {c.node}, op {c.position} of {c.ops_total})")
            lines.append(f"  module:     {c.module_path} ({c.module_type})")
            lines.append(f"  source:     {c.source}")
            ins = ", ".join(f"{i['dtype']}{i['shape']}" for i in c.inputs)
            lines.append(f"  inputs:     {ins or '(none)'}")
        else:
            lines.append("  culprit:    not localised (no prefix of the graph fails the same way)")
        if self.reproducer_dir is not None:
            state = {True: "yes", False: "NO (see stderr.txt)", None: "not checked"}[self.reproduced]
            lines.append(f"  reproducer: {self.reproducer_dir} ({self.reproducer_kind}); command.sh reproduces it: {state}")
            lines.append(f"  command:    {self.command}")
        lines.append(f"  attempts:   {n} compile attempts in {self.seconds:.1f}s")
        return "\n".join(lines)


_REPRO_FILES = ("repro.mlir", "repro.py", "command.sh", "stderr.txt", "inputs.pt", "check.py")
_REPRO_GLOBS = ("input*.npy", "expected*.npy", "got*.npy", "repro.vmfb", "repro.pt2")

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


# ---------------------------------------------------------------------------------------------
# Graph surgery


def graph_ops(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The nodes the search runs over: calls producing tensors, in topological order (getitems of
    multi-output ops and symbolic-size helpers ride along with their producers)."""
    import operator

    ops = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) or (
            isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
        ):
            ops.append(n)
    return ops


def _is_tensor_node(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


def prefix_outputs(ep: torch.export.ExportedProgram, ops: list[torch.fx.Node], k: int) -> list[torch.fx.Node]:
    """The values of the first k ops (and their getitems) that anything outside the prefix uses."""
    import operator

    inside = set(ops[:k])
    inside |= {u for n in ops[:k] for u in n.users if u.op == "call_function" and u.target is operator.getitem}
    outs = []
    for n in ep.graph.nodes:
        if n in inside and _is_tensor_node(n) and any(u not in inside for u in n.users):
            outs.append(n)
    return outs


def subprogram(ep: torch.export.ExportedProgram, outputs: list[torch.fx.Node]) -> torch.export.ExportedProgram:
    """`ep` cut so that it returns exactly `outputs` (as a tuple), everything else dead-code-eliminated.

    Parameters, buffers and user inputs stay as they are (so the importer still makes the weights
    external parameters and every attempt takes the same inputs); buffer mutations are dropped.
    """
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument
    import torch.utils._pytree as pytree

    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in ep.graph.nodes:
        if n.op == "output":
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    new_outs = [env[n] for n in outputs]
    g.output(tuple(new_outs))
    g.eliminate_dead_code()
    gm = torch.fx.GraphModule(ep.graph_module, g)
    sig = ExportGraphSignature(
        input_specs=list(ep.graph_signature.input_specs),
        output_specs=[OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=n.name), target=None) for n in new_outs],
    )
    out_spec = pytree.tree_flatten(tuple(range(len(new_outs))))[1]
    call = ModuleCallSignature(inputs=[], outputs=[], in_spec=ep.call_spec.in_spec, out_spec=out_spec)
    return torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=sig,
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=[ModuleCallEntry(fqn="", signature=call)],
        example_inputs=None,
        constants=ep.constants,
        verifiers=[ep.verifier],
    )


def search_prefix(n: int, fails, known_fail_at_n: bool = True) -> int | None:
    """Smallest k in 1..n with fails(k), for `fails` monotone in k (False below, True from k on).

    fails(n) is taken as known (the whole model failed) when `known_fail_at_n`. Returns None when
    fails(n) was not known and turns out False. Calls `fails` about log2(n) times.
    """
    lo, hi = 0, n  # fails(lo) is False (the empty prefix), fails(hi) is True
    if not known_fail_at_n:
        if n == 0 or not fails(n):
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi if n > 0 else None


def _concrete(d) -> int:
    if isinstance(d, int):
        return d
    node = getattr(d, "node", None)
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    try:
        return int(node.shape_env.size_hint(node.expr))
    except Exception:
        return 17


def _value_spec(v) -> dict:
    return {"shape": [_concrete(d) for d in v.shape], "dtype": str(v.dtype).removeprefix("torch.")}


def _arg_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The culprit's tensor inputs, each once, in first-use order."""
    seen: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: seen.append(a) if a not in seen and _is_tensor_node(a) else None)
    return seen


def one_op_module(node: torch.fx.Node) -> torch.fx.GraphModule:
    """A module whose forward is just `node`'s op, its tensor inputs as arguments (SymInts as their hint)."""
    g = torch.fx.Graph()
    inputs = _arg_nodes(node)
    env = {}
    for i, a in enumerate(inputs):
        env[a] = g.placeholder(f"arg{i}")

    def sub(a):
        if a in env:
            return env[a]
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt) or isinstance(val, int):
            return _concrete(val)
        raise CompileError(f"bisect: input {a.name} of {node.name} is a {type(val).__name__}; cannot make it a graph input")

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), sub)
    out = g.call_function(node.target, tuple(args), dict(kwargs))
    g.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _example_value(spec: dict, gen: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec["dtype"])
    if dtype.is_floating_point:
        return torch.randn(spec["shape"], generator=gen, dtype=torch.float32).to(dtype)
    if dtype.is_complex:
        return torch.randn(spec["shape"], generator=gen, dtype=dtype)
    return torch.zeros(spec["shape"], dtype=dtype)  # index-like inputs: 0 is always in range


# ---------------------------------------------------------------------------------------------
# Where a node comes from


def node_origin(node: torch.fx.Node, strip_prefix: str = "") -> tuple[str, str, str]:
    """(module path, module class, "file:line: code") from the node's export metadata."""
    stack = node.meta.get("nn_module_stack") or {}
    path, mtype = "", ""
    if stack:
        path, mtype = list(stack.values())[-1]
        mtype = mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype))
    if strip_prefix and path.startswith(strip_prefix):
        path = path[len(strip_prefix) :]
    elif strip_prefix and path == strip_prefix.rstrip("."):
        path = ""
    from llmc.compiler.per_layer import source_of

    where, code = source_of(node)
    source = "(no stack trace recorded)" if where is None else where + (f": {code}" if code else "")
    return path or "(top level)", mtype.rsplit(".", 1)[-1] or "?", source


def op_name(node: torch.fx.Node) -> str:
    """`aten.erfinv.default` for an ATen overload, the function's name otherwise."""
    t = node.target
    return str(t) if hasattr(t, "_schema") else getattr(t, "__name__", str(t))


# ---------------------------------------------------------------------------------------------
# Compiling and running one attempt


class _Session:
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
        self.log(f"attempt {i}: {what}: {outcome} ({seconds:.1f}s){': ' + _short(detail) if detail else ''}")
        return failure

    def _compile_and_check(self, program, strip_prefix, compare, work: Path) -> Failure | None:
        work.mkdir(parents=True)
        resolved = self.resolved
        flags = tuple(resolved.iree_flags)
        exported = export.Exported(program, strip_prefix)
        printed: list[str] = []
        try:
            # torch-mlir prints its diagnostics on fd 2 rather than into the exception: keep them.
            with _captured_fd2(printed):
                module, store, _ = importer.import_exported(exported, func_name="main")
        except CompileError as e:
            text = "".join(printed) + "\n" + str(e)
            sig, first = error_signature(text)
            return Failure("compile", "import", sig, first, text, None, flags)
        try:
            passes, _ = pipeline.build(resolved.caps.backend, self.dtype)
            pipeline.run_passes(module, passes)
        except LlmcError as e:
            sig, first = error_signature(str(e))
            return Failure("compile", "passes", sig, first, str(e), None, flags)
        mlir = str(module)
        del module
        vmfb = work / "m.vmfb"
        try:
            iree.compile_mlir(mlir, vmfb, list(flags), repro_dir=work / "repro", target_name=resolved.name)
        except CompileError as e:
            diagnostics = e.diagnostics or str(e)
            sig, first = error_signature(diagnostics)
            if sig == "(no diagnostics)":
                sig = first = str(e).splitlines()[0]
            return Failure("compile", "iree-compile", sig, first, diagnostics, mlir, flags)
        if compare is None or self.inputs is None:
            return None
        return self._run_and_compare(program, store, vmfb, compare, mlir, flags)

    def _run_and_compare(self, program, store, vmfb: Path, compare: list[str], mlir, flags) -> Failure | None:
        from llmc.runtime import load

        signature = artifacts.entry_signature(program, "main")
        params = None
        if store.tensors:
            store.write_irpa(vmfb.with_suffix(".irpa"))
            params = {"file": vmfb.with_suffix(".irpa").name, "scope": importer.PARAM_SCOPE}
        manifest = {
            "format": "llmc-bisect-attempt/1",
            "entry_points": {"main": signature},
            "default_entry": "main",
            "runtime_device": "local-task" if self.resolved.caps.device == "local" else self.resolved.caps.device,
            "params": params,
        }
        vmfb.with_suffix(".json").write_text(json.dumps(manifest))
        args, kwargs = self.inputs
        mod = load(vmfb)
        try:
            got = diff.tensor_leaves(mod(*args, **kwargs))
        except LlmcError as e:
            first = str(e).splitlines()[0]
            return Failure("drift", "run", "run failed: " + first, first, str(e), mlir, flags)
        finally:
            del mod
        if len(got) != len(compare):
            first = f"the module returned {len(got)} outputs, eager PyTorch {len(compare)}"
            return Failure("drift", "run", first, first, first, mlir, flags)
        tol = diff.TOLERANCES[self.dtype]
        results = [diff.compare(name, g, self.eager[name], tol) for name, g in zip(compare, got)]
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


def _short(text: str, n: int = 160) -> str:
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


def _user_output_nodes(program) -> list[str]:
    from torch.export.graph_signature import OutputKind, TensorArgument

    return [
        s.arg.name
        for s in program.graph_signature.output_specs
        if s.kind == OutputKind.USER_OUTPUT and isinstance(s.arg, TensorArgument)
    ]


# ---------------------------------------------------------------------------------------------
# The reproducer folder


_PY_NAMES = {float("inf"): 'float("inf")', float("-inf"): 'float("-inf")'}


def _py(v) -> str:
    """Python source for a constant argument of an aten op."""
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        return _PY_NAMES.get(v, repr(v))
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_py(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(x)}" for k, x in v.items()) + "}"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.fx.Node):
        return v.name
    raise ValueError(f"no Python spelling for {type(v).__name__} {v!r}")


def _target_source(target) -> str:
    if hasattr(target, "_schema"):  # an OpOverload: torch.ops.<ns>.<op>.<overload>
        ns = target.namespace
        packet = target._schema.name.split("::", 1)[1]
        return f"torch.ops.{ns}.{packet}.{target._overloadname}"
    mod = getattr(target, "__module__", None)
    return f"{mod}.{target.__name__}" if mod else target.__name__


def repro_py(
    gm: torch.fx.GraphModule, specs: list[dict], culprit: Culprit | None, error: str, with_inputs: bool, note: str = ""
) -> str:
    """A self-contained torch script that rebuilds the one-op module and exports it."""
    call = next(n for n in gm.graph.nodes if n.op == "call_function")
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    args = [_py(a) for a in call.args] + [f"{k}={_py(v)}" for k, v in call.kwargs.items()]
    error = error.replace("\\", "/").replace('"' * 3, "'" * 3)
    where = f"\nFrom {culprit.module_path} ({culprit.module_type}) at {culprit.source}" if culprit else ""
    if with_inputs:
        make = 'args = tuple(torch.load(HERE / "inputs.pt", weights_only=True))  # the values the op saw in the model'
    else:
        lines = []
        for s in specs:
            dt = getattr(torch, s["dtype"])
            if dt.is_floating_point:
                lines.append(f"    torch.randn({s['shape']}).to(torch.{s['dtype']}),")
            else:
                lines.append(f"    torch.zeros({s['shape']}, dtype=torch.{s['dtype']}),")
        make = "args = (\n" + "\n".join(lines) + "\n)"
    return f'''"""llmc bisect reproducer: one {_target_source(call.target)} call.{where}
Error: {error}{chr(10) + note if note else ""}

python repro.py          rebuild the module, export it, save repro.pt2 (llmc compile repro.pt2 ...)
python repro.py --mlir   also print the torch-dialect MLIR torch-mlir makes of it (needs torch-mlir)
"""
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class OneOp(torch.nn.Module):
    def forward(self, {", ".join(names)}):
        return {_target_source(call.target)}({", ".join(args)})


{make}
ep = torch.export.export(OneOp(), args)
torch.export.save(ep, str(HERE / "repro.pt2"))
print(ep.graph)
if "--mlir" in sys.argv:
    from torch_mlir import fx

    print(fx.export_and_import(OneOp(), *args, output_type="torch", func_name="main"))
'''


_CHECK_PY = '''"""Compares iree-run-module's outputs (got*.npy) with eager PyTorch's (expected*.npy). Exit 1 on drift."""
import math
import sys
from pathlib import Path

import numpy as np

MAX_REL, MIN_COSINE = {max_rel!r}, {min_cosine!r}  # llmc's {dtype} tolerance profile
here = Path(__file__).resolve().parent
failed = False
for i in range({n}):
    got = np.load(here / f"got{{i}}.npy").astype(np.float64).ravel()
    ref = np.load(here / f"expected{{i}}.npy").astype(np.float64).ravel()
    max_abs = float(np.abs(got - ref).max()) if ref.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    cos = float(got @ ref) / max(float(np.linalg.norm(got) * np.linalg.norm(ref)), 1e-300)
    bad = not (max_rel <= MAX_REL and cos >= MIN_COSINE)
    failed |= bad
    print(f"{{'DRIFT' if bad else 'ok'}} output {{i}}: max_abs {{max_abs:.4g}}, max_rel {{max_rel:.4g}} (<= {{MAX_REL}}), cosine {{cos:.7f}} (>= {{MIN_COSINE}})")
sys.exit(1 if failed else 0)
'''


def _npy_ok(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def write_reproducer(
    out_dir: Path, failure: Failure, gm, specs, culprit, kind: str, inputs=None, expected=None, dtype: str = "f32", note: str = ""
) -> str:
    """Write the reproducer files into `out_dir`; returns the command line (as in command.sh)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_outputs(out_dir, _REPRO_FILES + _REPRO_GLOBS)
    tol = diff.TOLERANCES.get(dtype, diff.TOLERANCES["f32"])
    if gm is not None:
        (out_dir / "repro.py").write_text(repro_py(gm, specs, culprit, failure.first_line, inputs is not None, note))
    # iree-compile names its temporary input; the reproducer's copy is repro.mlir.
    (out_dir / "stderr.txt").write_text(re.sub(r"\S*llmc-compile-[^/\s]+/input\.mlir", "repro.mlir", failure.diagnostics))
    header = f"#!/bin/sh\n# llmc bisect reproducer ({kind}): {failure.first_line}\n"
    if failure.mlir is None:
        # torch-mlir rejected the graph before iree-compile saw it: torch-mlir itself reproduces it.
        command = "python3 repro.py --mlir"
        body = f'cd "$(dirname "$0")" || exit 2\nexec {command}\n'
    else:
        (out_dir / "repro.mlir").write_text(failure.mlir)
        compile_cmd = shlex.join(["iree-compile", "repro.mlir", "--iree-input-type=torch", *failure.flags, "-o", "repro.vmfb"])
        command = compile_cmd
        body = 'cd "$(dirname "$0")" || exit 2\n'
        if failure.kind == "compile":
            body += f"exec {compile_cmd}\n"
        elif inputs is None or not all(_npy_ok(t) for t in list(inputs) + list(expected)):
            # bf16 (or other non-numpy) values: iree-run-module's .npy files can't carry them.
            if inputs is not None:
                torch.save(list(inputs), out_dir / "inputs.pt")
            body += f"# the drift check needs values .npy cannot hold; this compiles only\nexec {compile_cmd}\n"
        else:
            import numpy as np

            torch.save(list(inputs), out_dir / "inputs.pt")
            run = ["iree-run-module", "--device=local-task", "--module=repro.vmfb", "--function=main"]
            for i, t in enumerate(inputs):
                np.save(out_dir / f"input{i}.npy", t.contiguous().numpy())
                run.append(f"--input=@input{i}.npy")
            for i, t in enumerate(expected):
                np.save(out_dir / f"expected{i}.npy", t.contiguous().numpy())
                run.append(f"--output=@got{i}.npy")
            (out_dir / "check.py").write_text(
                _CHECK_PY.format(max_rel=tol["max_rel"], min_cosine=tol["min_cosine"], dtype=dtype, n=len(expected))
            )
            command = f"{compile_cmd} && {shlex.join(run)} && python3 check.py"
            body += f"{compile_cmd} || exit 2\n{shlex.join(run)} || exit 2\nexec python3 check.py\n"
    (out_dir / "command.sh").write_text(header + body)
    os.chmod(out_dir / "command.sh", 0o755)
    return command


def _remove_outputs(out_dir: Path, patterns) -> None:
    for pattern in patterns:
        for p in out_dir.glob(pattern):
            if p.is_file():
                p.unlink()


def check_reproducer(out_dir: Path, failure: Failure) -> tuple[bool, str]:
    """Run command.sh once; (fails the same way, first line of what it printed)."""
    tool_dir = str(Path(iree.iree_compile_path()).parent)
    env = {**os.environ, "PATH": f"{tool_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["sh", str(out_dir / "command.sh")], capture_output=True, text=True, env=env, timeout=3600)
    _remove_outputs(out_dir, ("repro.vmfb", "repro.pt2", "got*.npy"))
    if failure.kind == "drift":
        drifted = proc.returncode == 1 and "DRIFT" in proc.stdout
        line = next((l for l in proc.stdout.splitlines() if "DRIFT" in l), (proc.stderr or proc.stdout).strip()[:200])
        return drifted, line
    if proc.returncode == 0:
        return False, "command.sh succeeded"
    sig, first = error_signature(proc.stderr)
    if failure.stage == "import":
        return failure.signature in error_signature_all(proc.stderr), first
    return sig == failure.signature, first


def error_signature_all(text: str) -> set[str]:
    """Signatures of every error line in `text` (torch-mlir prints the failing pass's errors after notes)."""
    out = set()
    for line in text.splitlines():
        if "error:" in line:
            out.add(error_signature(line)[0])
    return out


# ---------------------------------------------------------------------------------------------
# The driver


def bisect(
    model,
    example_args: tuple = (),
    *,
    target: str = "cpu",
    dtype: str = "f32",
    arch: str | None = None,
    output_dir=None,
    example_kwargs: dict | None = None,
    seed: int = 0,
    quiet: bool = False,
    progress=None,
) -> BisectReport:
    """Find the smallest sub-graph of `model` that iree-compile rejects (or that drifts from eager)
    and write a one-op reproducer into `output_dir`.

    model: an nn.Module (with example_args), an ExportedProgram or a .pt2 path.
    Inputs for the drift check: `example_args` when given, else llmc diff's seeded random inputs.
    Returns a BisectReport (status "ok", "compile-error" or "drift"); raises UsageError-family
    errors for bad input. Progress: one line per compile attempt on `progress` (stderr by default).
    """
    started = time.perf_counter()
    probe = targets.resolve(target, arch, dtype)
    model_name = type(model).__name__
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
        if path.suffix != ".pt2":
            raise UsageError(f"{path}: llmc bisect takes a torch.export archive (.pt2)")
        model_name = path.name
        model = export.load_pt2(path)
    out_dir = Path(output_dir) if output_dir is not None else Path.cwd() / f"{Path(model_name).stem}.bisect"
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a directory")
    if not out_dir.parent.is_dir():
        raise UsageError(f"-o {out_dir}: parent directory {out_dir.parent} does not exist")
    progress = None if quiet else (progress or sys.stderr)

    exported = export.export_model(model, tuple(example_args), example_kwargs, dtype=dtype, attention=probe.caps.attention)
    program = exported.program
    resolved = targets.resolve(target, arch, dtype, dynamic=export.is_dynamic(program))
    runs_here = resolved.caps.runs_here.startswith("yes")
    inputs = eager = None
    if runs_here:
        if example_args or example_kwargs:
            inputs = (tuple(example_args), dict(example_kwargs or {}))
        else:
            entry = artifacts.entry_signature(program, "main")
            inputs = diff.random_inputs(entry, seed, diff.int_high(program))
        eager = eager_values(program, *inputs)

    ops = graph_ops(program)
    scratch = Path(tempfile.mkdtemp(prefix="llmc-bisect-"))
    s = _Session(program, resolved, scratch, progress, inputs, eager)
    report = BisectReport("ok", model_name, resolved.name, dtype, resolved.arch, len(ops), s.attempts, 0.0)
    report.compared = runs_here
    try:
        s.log(f"{model_name}: {len(ops)} ops, target {resolved.name}, dtype {dtype}; compiling the whole model")
        whole = s.attempt("whole model", program, exported.strip_prefix, _user_output_nodes(program) if runs_here else None)
        if whole is None:
            report.seconds = time.perf_counter() - started
            return report
        s.expected = whole
        report.status = "compile-error" if whole.kind == "compile" else "drift"
        report.failure = whole
        _localise(s, report, exported.strip_prefix, ops, out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


def _localise(s: _Session, report: BisectReport, strip_prefix: str, ops, out_dir: Path) -> None:
    program, expected = s.program, s.expected
    drift = expected.kind == "drift"
    smallest: dict = {}

    def fails(k: int) -> bool:
        outs = prefix_outputs(program, ops, k)
        sub = subprogram(program, outs)
        last = ops[k - 1]
        f = s.attempt(f"prefix {k}/{len(ops)} (ends at {op_name(last)})", sub, strip_prefix, [n.name for n in outs] if drift else None)
        same = f is not None and f.signature == expected.signature
        if same and (not smallest or k < smallest["k"]):
            smallest.update(k=k, failure=f)
        return same

    k = search_prefix(len(ops), fails, known_fail_at_n=True)
    if k is not None and not smallest:
        # Never saw a failing prefix: the whole model's failure was the only evidence for k = n.
        if not fails(len(ops)):
            k = None
    if k is None:
        s.log("no prefix of the graph fails the same way; the reproducer is the whole model")
        report.reproducer_kind = "whole model"
        report.reproducer_dir = out_dir
        if expected.mlir is None:  # torch-mlir rejected the whole model only: nothing smaller to save
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "stderr.txt").write_text(expected.diagnostics)
            return
        report.command = write_reproducer(out_dir, expected, None, [], None, "whole model")
        _check(s, report, out_dir, expected)
        return

    node = ops[k - 1]
    path, mtype, source = node_origin(node, strip_prefix)
    arg_nodes = _arg_nodes(node)
    specs = [_value_spec(a.meta["val"]) for a in arg_nodes]
    report.culprit = Culprit(node.name, op_name(node), k, len(ops), path, mtype, source, specs)
    s.log(f"culprit: {op_name(node)} (node {node.name}) in {path} at {source}")

    # Reduce to one op.
    gm = one_op_module(node)
    if drift:
        args = tuple(s.eager[a.name] for a in arg_nodes)
    else:
        gen = torch.Generator().manual_seed(0)
        args = tuple(_example_value(sp, gen) for sp in specs)
    one = _export_one_op(gm, args, s)
    failure, kind = None, "one op"
    if one is not None:
        s_inputs, s_eager = s.inputs, s.eager
        if drift:
            out_val = s.eager[node.name]
            out_vals = list(out_val) if isinstance(out_val, (tuple, list)) else [out_val]
            s.inputs = (args, {})
            s.eager = {f"out{i}": v for i, v in enumerate(out_vals)}
            compare = list(s.eager)
        else:
            compare = None
        try:
            failure = s.attempt("one op " + op_name(node), one, "", compare)
        finally:
            s.inputs, s.eager = s_inputs, s_eager
        if failure is not None and failure.signature != expected.signature:
            failure = None
    if failure is None and not drift and not _is_multi(node):
        # The op alone passes: keep its producers, cut right after it.
        kind = "cut at culprit"
        failure = s.attempt(f"cut at {node.name}", subprogram(program, [node]), strip_prefix, None)
        if failure is not None and failure.signature != expected.signature:
            failure = None
    if failure is None:
        kind, failure = "prefix", smallest["failure"]
    report.reproducer_kind = kind
    report.reproducer_dir = out_dir
    if kind == "one op":
        ins = list(args) if drift else None
        exp = None
        if drift:
            v = s.eager[node.name]
            exp = list(v) if isinstance(v, (tuple, list)) else [v]
        report.command = write_reproducer(out_dir, failure, gm, specs, report.culprit, kind, ins, exp, s.dtype)
    else:
        note = f"This op alone does not fail; repro.mlir holds it with its producers ({kind})."
        report.command = write_reproducer(out_dir, failure, gm, specs, report.culprit, kind, note=note)
    _check(s, report, out_dir, failure)


def _is_multi(node) -> bool:
    return not _is_tensor_node(node)


def _export_one_op(gm, args, s: _Session):
    try:
        with torch.no_grad():
            ep = torch.export.export(gm, args, strict=False)
        return ep.run_decompositions(export.decomposition_table(s.resolved.caps.attention))
    except Exception as e:  # the op doesn't re-export on its own: fall back to the cut graph
        s.log(f"the culprit does not export on its own ({type(e).__name__}: {_short(str(e), 100)}); keeping its context")
        return None


def _check(s: _Session, report: BisectReport, out_dir: Path, failure: Failure) -> None:
    if failure.kind == "drift" and not (out_dir / "check.py").exists():
        report.reproduced = None  # bf16 or non-numpy inputs: no iree-run-module input files
        s.log("command.sh compiles only (inputs are not numpy-representable): not checked")
        return
    i = len(s.attempts) + 1
    start = time.perf_counter()
    ok, line = check_reproducer(out_dir, failure)
    seconds = time.perf_counter() - start
    s.attempts.append(Attempt(i, "check command.sh", "fails the same way" if ok else "does not reproduce", seconds, line))
    s.log(f"attempt {i}: check command.sh: {'fails the same way' if ok else 'does NOT reproduce'} ({seconds:.1f}s): {_short(line)}")
    report.reproduced = ok


def write_json(report: BisectReport, path: Path) -> None:
    artifacts.write_text_atomic(Path(path), json.dumps(report.as_dict(), indent=2) + "\n")
