"""`llmc diff`, the CI stage: compile (unless an artifact is given), run eager PyTorch and the module
on the same inputs, compare every output, and localise the first divergent module on request.

What is compared and how lives in compiler/diff_metrics.py, the inputs in compiler/diff_inputs.py,
the eager side in compiler/diff_eager.py; language-model checkpoints take compiler/diff_llm.py
(prompt + greedy decode steps), per-layer localisation compiler/per_layer.py. The result is a
report (compiler/report.py) and the lines the CLI prints; the CLI writes the files.
"""

from __future__ import annotations

from llmc import dtypes

import dataclasses
from pathlib import Path

from llmc.compiler import export
from llmc.compiler.diff_eager import eager_reference, run_eager
from llmc.compiler.lower import QUANTIZED_DTYPES
from llmc.compiler.diff_inputs import check_built_with, int_high, load_inputs, random_inputs
from llmc.runtime.module import shape_text
from llmc.compiler.diff_metrics import (
    DEFAULT_TOP_K,
    TOLERANCES,
    diff_outputs,
    logits_outputs,
    parse_tolerance,
    result_line,
    worst,
)
from llmc.compiler.report import DiffOutcome
from llmc.errors import UsageError


@dataclasses.dataclass
class DiffOptions:
    model: Path
    artifact: Path | None = None  # None: compile `model` first (target/dtype/arch, into `output` or a temp dir)
    target: str | None = None
    dtype: str | None = None
    arch: str | None = None
    output: Path | None = None
    inputs: Path | None = None  # an .npz file; None: seeded random inputs
    seed: int = 0
    seq: int | None = None
    profile: str = "auto"
    tolerance: str | None = None  # "max_rel=1e-4,min_cosine=0.999"
    logits: tuple[str, ...] = ()
    top_k: int = DEFAULT_TOP_K
    per_layer: bool = False
    per_layer_depth: int | None = None
    repro_dir: Path | None = None
    verbose: bool = False
    steps: int | None = None  # language-model artifacts: greedy decode steps after the prompt


def _check_options(o: DiffOptions) -> dict:
    """Everything that can be checked before loading anything; returns the --tolerance overrides."""
    if not o.model.exists():
        raise UsageError(f"{o.model}: no such file")
    if o.artifact is not None:
        if not o.artifact.exists():
            raise UsageError(f"{o.artifact}: no such file")
        if o.output is not None:
            raise UsageError(f"-o {o.output}: -o names the module to compile; with an artifact given there is nothing to compile")
    if o.top_k < 1:
        raise UsageError(f"--top-k {o.top_k}: must be at least 1")
    if o.per_layer_depth is not None and o.per_layer_depth < 1:
        raise UsageError(f"--per-layer-depth {o.per_layer_depth}: must be at least 1 (1 = the modules the model calls directly)")
    if o.profile != "auto" and o.profile not in TOLERANCES:
        raise UsageError(f"--tolerance-profile={o.profile}: choose one of auto, {', '.join(TOLERANCES)}")
    if o.inputs is not None and not o.inputs.exists():
        raise UsageError(f"--inputs {o.inputs}: no such file")
    return parse_tolerance(o.tolerance)


def _check_signatures(model: Path, artifact: Path, pt2_sig: dict, entry: dict) -> None:
    """The artifact's inputs must be the model's (same paths, dtypes and ranks)."""
    ours = {e["path"]: e for e in pt2_sig["inputs"]}
    for e in entry["inputs"]:
        m = ours.get(e["path"])
        if m is None:
            raise UsageError(f"{artifact} takes input {e['path']} that {model} does not; diff the artifact against the model it was compiled from")
        if e["kind"] != m["kind"] or (e["kind"] == "tensor" and (len(e["shape"]) != len(m["shape"]) or e["dtype"] != m["dtype"])):
            mine = f"{m['dtype']}{shape_text(m['shape'])}" if m["kind"] == "tensor" else f"constant {m.get('value')!r}"
            theirs = f"{e['dtype']}{shape_text(e['shape'])}" if e["kind"] == "tensor" else f"constant {e.get('value')!r}"
            raise UsageError(
                f"{artifact} takes input {e['path']} as {theirs} but {model} as {mine}; "
                "diff the artifact against the model it was compiled from"
            )
    extra = [p for p in ours if p not in {e["path"] for e in entry["inputs"]}]
    if extra:
        raise UsageError(f"{model} takes input {extra[0]} that {artifact} does not; diff the artifact against the model it was compiled from")


def _aliases(pt2_sig: dict, entry: dict) -> dict:
    """The .pt2's own input names (the user's), which re-export may rename (`x` -> `args_0`)."""
    by_path = {e["path"]: e for e in entry["inputs"]}
    return {e["name"]: e["path"] for e in pt2_sig["inputs"] if e.get("name") and e["path"] in by_path}


def run(o: DiffOptions) -> DiffOutcome:
    """Compile (if no artifact is given), run eager and compiled on the same inputs, compare, localise."""
    from llmc.compiler.progress import quiet_pytree_warnings

    with quiet_pytree_warnings():  # torch's own deprecation noise, between the diff's lines otherwise
        return _run(o)


def _run(o: DiffOptions) -> DiffOutcome:
    import contextlib
    import tempfile
    import time

    from llmc.compiler import artifacts, per_layer, report
    from llmc.runtime import load

    overrides = _check_options(o)
    from llmc.compiler import llm

    if o.model.suffix != ".pt2" and llm.is_llama_checkpoint(o.model):
        from llmc.compiler import diff_llm

        return diff_llm.run(o, overrides)
    if o.steps is not None:
        raise UsageError(f"--steps: applies to language-model checkpoints; {o.model} is not one")
    if o.artifact is None:
        from llmc.compiler import targets

        targets.resolve(o.target or "cpu", o.arch, o.dtype or "f32")  # bad flags fail before any work
    ep = export.load_pt2(o.model)
    pt2_sig = artifacts.entry_signature(ep, "main")

    with contextlib.ExitStack() as stack:
        scratch = lambda: Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmc-diff-")))
        repro_dir = o.repro_dir or Path.cwd()
        if o.artifact is None:
            from llmc.compiler.api import compile_model

            if o.inputs is not None:
                load_inputs(o.inputs, pt2_sig)  # a bad file fails before the compile, not after
            output = o.output if o.output is not None else scratch() / f"{o.model.stem}.vmfb"
            art = compile_model(
                o.model, target=o.target or "cpu", dtype=o.dtype or "f32", arch=o.arch, output=output,
                repro_dir=o.repro_dir or (None if o.output is not None else repro_dir), quiet=not o.verbose,
            )
            vmfb = art.vmfb
        else:
            vmfb = o.artifact
        mod = load(vmfb)
        manifest = mod.manifest
        if o.artifact is not None:
            check_built_with(o, manifest)
        entry_name = mod.default_entry
        entry = manifest["entry_points"][entry_name]
        _check_signatures(o.model, vmfb, pt2_sig, entry)
        dtype = manifest["dtype"]
        profile = dtype if o.profile == "auto" else o.profile
        if profile not in TOLERANCES:
            raise UsageError(f"{vmfb}: no tolerance profile for dtype {dtype}; pass --tolerance-profile ({', '.join(TOLERANCES)})")
        tol = {**TOLERANCES[profile], **overrides}
        logits = logits_outputs(entry["outputs"], o.logits)
        if o.inputs is not None:
            args, kwargs = load_inputs(o.inputs, entry, _aliases(pt2_sig, entry))
        else:
            args, kwargs = random_inputs(entry, o.seed, int_high(ep), o.seq)

        start = time.perf_counter()
        eager_dtype = dtype if dtypes.compute_torch_dtype(dtype) is not None else manifest["compute_dtype"]  # fp8/int8: eager in the compute dtype
        ref = run_eager(eager_reference(ep, eager_dtype), args, kwargs)
        got = mod(*args, **kwargs)
        seconds = time.perf_counter() - start
        results = diff_outputs(entry["outputs"], got, ref, dtype, tol, logits=logits, top_k=o.top_k)
        bad = worst(results)

        pl = None
        if o.per_layer or o.per_layer_depth is not None:
            pl = per_layer.localise(
                ep, mod, args, kwargs, tol, depth=o.per_layer_depth, workdir=scratch(), repro_dir=repro_dir, quiet=not o.verbose
            )
        same = None
        if dtype in QUANTIZED_DTYPES:  # the second reference: eager with the same quantized weights, dequantized in PyTorch
            import copy

            from llmc.compiler.diff_eager import same_quantized_weights

            start = time.perf_counter()
            same_module = copy.deepcopy(eager_reference(ep, eager_dtype))  # a copy: `ep` keeps its weights
            n_same = same_quantized_weights(same_module, mod.params, manifest)
            s_tol = TOLERANCES[manifest["compute_dtype"]]
            s_results = diff_outputs(entry["outputs"], got, run_eager(same_module, args, kwargs), dtype, s_tol, logits=logits, top_k=o.top_k)
            same = report.SameWeights(s_results, manifest["compute_dtype"], s_tol, n_same, time.perf_counter() - start, label=dtype)

    passed = all(r.passed for r in results)
    lines = [result_line(r) for r in results]
    if pl is not None:
        lines.extend(per_layer.summary_lines(pl, o.verbose))
    if same is not None:
        lines.extend(f"same {same.label} weights: {result_line(r)}" for r in same.results)
    n_fail = sum(not r.passed for r in results)
    if passed:
        summary = f"PASS: {len(results)} output(s), tolerance profile {profile}" + (f", worst {bad.name}" if bad else "")
    else:
        summary = f"FAIL: {n_fail} of {len(results)} output(s) over tolerance (profile {profile}); worst {bad.name}: {bad.reason}"
        if pl is not None:
            summary += f"; first divergent module: {pl.first.probe.module}" if pl.first else "; no module output over tolerance"
    if same is not None:
        summary = same.summary(summary, passed)
    lines.append(summary)
    entries = [report.entry_record(entry_name, results, bad, seconds, pl)]
    if same is not None:
        entries.append(same.entry(entry_name))
    rep = report.build_report(
        summary=summary, model=str(o.model), artifact=str(vmfb), compiled_by_diff=o.artifact is None, manifest=manifest,
        profile=profile, tolerance=tol, overrides=overrides,
        inputs={"source": "file" if o.inputs else "random", "seed": None if o.inputs else o.seed, "file": str(o.inputs) if o.inputs else None},
        entries=entries, same_weights=same and same.record(),
    )
    return DiffOutcome(rep["passed"], rep, lines)
