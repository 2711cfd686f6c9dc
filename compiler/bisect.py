"""llmc bisect: from a model that iree-compile rejects (or that drifts from eager) to a one-op reproducer.

The search, in order:
1. Compile the whole model exactly as `llmc compile` does (same export, importer with external
   parameters, passes and iree-compile flags). On a target that runs here, also run it and compare
   with eager PyTorch against `diff_metrics.TOLERANCES[dtype]`. Compiles and matches: done
   (status "ok").
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

The parts: graph surgery in compiler/bisect_graph.py, compiling and running one attempt in
compiler/bisect_session.py, the reproducer folder in compiler/bisect_repro.py; this file holds the
driver (the search above) and its report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from llmc import dtypes
from llmc.compiler import artifacts, diff_inputs, export, lower, pipeline, targets
from llmc.compiler.bisect_graph import (
    Culprit,
    example_value,
    graph_ops,
    is_tensor_node,
    node_origin,
    one_op_module,
    op_name,
    prefix_outputs,
    search_prefix,
    subprogram,
    tensor_inputs,
    user_output_nodes,
    value_spec,
)
from llmc.compiler.bisect_repro import check_reproducer, write_reproducer
from llmc.compiler.bisect_session import Attempt, Failure, Session, eager_values, short
from llmc.errors import UsageError


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
            raise UsageError(f"{path}: llmc bisect takes a torch.export archive (.pt2) or a Llama checkpoint (Meta .pth + params.json, or an HF folder)")
        model_name = path.name
        model = export.load_pt2(path)
    out_dir = Path(output_dir) if output_dir is not None else Path.cwd() / f"{Path(model_name).stem}.bisect"
    _check_out_dir(out_dir)
    progress = None if quiet else (progress or sys.stderr)

    plan = pipeline.build(probe)
    exported = lower.export_main(model, plan, example_args, example_kwargs).exported
    given = (tuple(example_args), dict(example_kwargs or {})) if example_args or example_kwargs else None
    return _bisect_program(exported, model_name, probe, plan, given, seed, out_dir, progress, started)


def bisect_llm(
    checkpoint,
    *,
    target: str = "cpu",
    dtype: str = "f32",
    arch: str | None = None,
    output_dir=None,
    seed: int = 0,
    max_seq_len: int | None = None,
    quiet: bool = False,
    progress=None,
) -> list[BisectReport]:
    """Bisect each entry point of the module `llmc compile CHECKPOINT` builds (prefill, then decode).

    Each entry point is exported as compiler/llm.py exports it and searched on its own, with its
    reproducer in OUTPUT_DIR/<entry>. The drift check feeds a seeded random prompt (prefill) and one
    token against an 8-position prefix of a zero cache (decode).
    """
    from llmc.compiler import llm

    probe = targets.resolve(target, arch, dtype)
    path = Path(checkpoint)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    name = llm.default_name(path)
    out_dir = Path(output_dir) if output_dir is not None else Path.cwd() / f"{name}.bisect"
    _check_out_dir(out_dir)
    progress = None if quiet else (progress or sys.stderr)
    llama = llm.load_llama(path)
    cfg = llama.config
    max_len = max_seq_len or min(cfg.max_seq_len, 64)
    if max_len < 10 or max_len > cfg.max_seq_len:
        raise UsageError(f"--max-seq-len={max_len}: bisect needs 10 to {cfg.max_seq_len} positions")
    gen = torch.Generator().manual_seed(seed)
    from llmc.models.llama.model import new_cache

    kv_dtype = llm.resolve_kv_dtype("auto", probe, 1)  # the cache `llmc compile` would give it (bf16 for cpu bf16)
    cache = new_cache(cfg, max_len, dtypes.compute_torch_dtype(kv_dtype))
    inputs = {
        "prefill": ((torch.randint(0, cfg.vocab_size, (1, 8), generator=gen), *cache), {}),
        "decode": ((torch.randint(0, cfg.vocab_size, (1, 1), generator=gen), torch.ones(1, 9, dtype=torch.int64), *cache), {}),
    }
    reports = []
    for entry in llm.export_llm(llama, probe.compute_dtype, max_len, kv_dtype=kv_dtype):
        started = time.perf_counter()
        plan = pipeline.build(probe)
        reports.append(_bisect_program(entry.exported, f"{path.name}:{entry.function}", probe, plan, inputs[entry.function],
                                       seed, out_dir / entry.function, progress, started, tied=entry.tied or ()))
    return reports


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a directory")
    if not out_dir.parent.is_dir():
        raise UsageError(f"-o {out_dir}: parent directory {out_dir.parent} does not exist")


def _bisect_program(exported, model_name: str, probe, plan, given_inputs, seed: int, out_dir: Path, progress, started: float,
                    tied=()) -> BisectReport:
    """The search over one exported program (see the module docstring)."""
    # The search runs over the program after the graph passes (the op set iree-compile sees); each
    # attempt then lowers a sub-program of it through compiler/lower.py without rerunning them.
    dtype = probe.dtype
    program = pipeline.run_graph(plan, exported.program, tied_outputs=tied)
    exported = export.Exported(program, exported.strip_prefix)
    resolved = probe.for_shapes(export.is_dynamic(program))
    runs_here = resolved.caps.runs_here
    inputs = eager = None
    if runs_here:
        if given_inputs is not None:
            inputs = given_inputs
        else:
            entry = artifacts.entry_signature(program, "main")
            inputs = diff_inputs.random_inputs(entry, seed, diff_inputs.int_high(program))
        eager = eager_values(program, *inputs)

    ops = graph_ops(program)
    scratch = Path(tempfile.mkdtemp(prefix="llmc-bisect-"))
    s = Session(program, resolved, scratch, progress, inputs, eager)
    report = BisectReport("ok", model_name, resolved.name, dtype, resolved.arch, len(ops), s.attempts, 0.0)
    report.compared = runs_here
    try:
        s.log(f"{model_name}: {len(ops)} ops, target {resolved.name}, dtype {dtype}; compiling the whole model")
        whole = s.attempt("whole model", program, exported.strip_prefix, user_output_nodes(program) if runs_here else None)
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


def _localise(s: Session, report: BisectReport, strip_prefix: str, ops, out_dir: Path) -> None:
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
    arg_nodes = tensor_inputs(node)
    specs = [value_spec(a.meta["val"]) for a in arg_nodes]
    report.culprit = Culprit(node.name, op_name(node), k, len(ops), path, mtype, source, specs)
    s.log(f"culprit: {op_name(node)} (node {node.name}) in {path} at {source}")

    # Reduce to one op.
    gm = one_op_module(node)
    if drift:
        args = tuple(s.eager[a.name] for a in arg_nodes)
    else:
        gen = torch.Generator().manual_seed(0)
        args = tuple(example_value(sp, gen) for sp in specs)
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
    return not is_tensor_node(node)


def _export_one_op(gm, args, s: Session):
    try:
        with torch.no_grad():
            ep = torch.export.export(gm, args, strict=False)
        plan = pipeline.build(s.resolved)
        # One op's outputs are intermediate values, compared in the compute dtype: not cast like the
        # program's own outputs (passes/bf16_outputs.py).
        plan.graph = [p for p in plan.graph if p.name != "bf16-outputs"]
        return pipeline.run_graph(plan, ep)
    except Exception as e:  # the op doesn't re-export on its own: fall back to the cut graph
        s.log(f"the culprit does not export on its own ({type(e).__name__}: {short(str(e), 100)}); keeping its context")
        return None


def _check(s: Session, report: BisectReport, out_dir: Path, failure: Failure) -> None:
    if failure.kind == "drift" and not (out_dir / "check.py").exists():
        report.reproduced = None  # bf16 or non-numpy inputs: no iree-run-module input files
        s.log("command.sh compiles only (inputs are not numpy-representable): not checked")
        return
    i = len(s.attempts) + 1
    start = time.perf_counter()
    ok, line = check_reproducer(out_dir, failure)
    seconds = time.perf_counter() - start
    s.attempts.append(Attempt(i, "check command.sh", "fails the same way" if ok else "does not reproduce", seconds, line))
    s.log(f"attempt {i}: check command.sh: {'fails the same way' if ok else 'does NOT reproduce'} ({seconds:.1f}s): {short(line)}")
    report.reproduced = ok


def write_json(report: BisectReport | list[BisectReport], path: Path) -> None:
    """One report (llmc-bisect/1), or one per entry point of a Llama module (llmc-bisect-llm/1)."""
    if isinstance(report, list):
        data = {"format": "llmc-bisect-llm/1", "entry_points": [r.as_dict() for r in report]}
    else:
        data = report.as_dict()
    artifacts.write_text_atomic(Path(path), json.dumps(data, indent=2) + "\n")
