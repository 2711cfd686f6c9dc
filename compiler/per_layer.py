"""First-divergence localisation for `llmc diff --per-layer`: which module's output goes wrong first.

How it works:
1. Probes. torch.export records, on every node, the stack of nn.Modules whose forward produced it
   (`node.meta["nn_module_stack"]`). A module's output is the last node in its scope whose value
   is used outside it (by a later node or as a graph output; a buffer's functionalised update is
   state, not output). Modules that compute nothing (Identity) have no output of their own.
   Every module at any depth is probed,
   or those down to `depth` levels below the model (1: `layers.3`, `lm_head`; 2 adds
   `layers.3.self_attn`, ...).
2. Instrumentation. A copy of the exported graph returns the probed values as extra outputs
   (the original outputs come first, unchanged). It is instrumented before the dtype change and
   the decompositions, so it goes through exactly the steps the artifact went through
   (export.export_model -> importer -> pipeline passes) and is compiled with the artifact's own
   IREE flags from its manifest.
3. Run with the artifact's weights. llmc names parameters by their FQN, so the instrumented
   module reads the artifact's own .irpa: whatever differs in the artifact's weights shows up.
4. Compare with eager PyTorch (the same instrumented graph run eagerly with the model's weights)
   in topological order; the first module over tolerance is named with its source line
   (`node.meta["stack_trace"]`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import time
from pathlib import Path

import torch

from llmc.compiler import diff_eager, diff_metrics, export, lower, pipeline
from llmc.compiler.progress import Phases
from llmc.errors import UsageError


@dataclasses.dataclass
class Probe:
    module: str  # dotted module path, e.g. "layers.3.self_attn"
    type: str  # the module's class, e.g. "torch.nn.modules.linear.Linear"
    level: int  # 1 = a module the model's forward calls directly
    node: str  # FX node holding the module's output (in the exported program given)
    order: int  # the node's position in the graph (topological order)
    source: str | None = None  # "file:line" of the innermost frame in the user's code
    code: str | None = None  # that line's text


@dataclasses.dataclass
class ModuleDiff:
    probe: Probe
    diff: diff_metrics.OutputDiff

    def as_dict(self) -> dict:
        p, d = self.probe, self.diff
        return {
            "module": p.module,
            "type": p.type,
            "level": p.level,
            "node": p.node,
            "source": p.source,
            "code": p.code,
            "shape": d.shape,
            "dtype": d.dtype,
            "max_abs": d.max_abs,
            "max_rel": d.max_rel,
            "cosine": d.cosine,
            "passed": d.passed,
            "reason": d.reason,
        }


@dataclasses.dataclass
class PerLayerResult:
    depth: int | None
    modules: list[ModuleDiff]
    first: ModuleDiff | None
    compile_seconds: float
    params: str | None  # the parameter archive the instrumented module ran with


def _clean_path(path: str) -> str:
    """Module paths as users write them: `L['self'].layers[0]` (strict export) -> `layers.0`."""
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return path.strip(".")


_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in .*$')


def source_of(node) -> tuple[str | None, str | None]:
    """("file:line", code) of the innermost stack frame outside torch and llmc's export wrappers, else the innermost one."""
    frames = []  # [file, line, code or None]
    for text in (node.meta.get("stack_trace") or "").splitlines():
        m = _FRAME.match(text)
        if m:
            frames.append([m.group(1), m.group(2), None])
        elif frames and frames[-1][2] is None and text.strip():
            frames[-1][2] = text.strip()
    if not frames:
        return None, None
    # llmc's own wrappers (export.CastInputs) are not where the user's op is either.
    ours = os.path.abspath(export.__file__)
    user = [f for f in frames if not os.path.abspath(f[0]).startswith(_TORCH_DIR + os.sep) and os.path.abspath(f[0]) != ours]
    file, line, code = (user or frames)[-1]
    if code is None:  # no code line for <stdin> and the like; the file may still be readable
        import linecache

        code = linecache.getline(file, int(line)).strip() or None
    return f"{file}:{line}", code


def select_probes(ep: torch.export.ExportedProgram, depth: int | None = None) -> list[Probe]:
    """The module outputs to compare, in topological order (an inner module before the outer one it ends)."""
    nodes = list(ep.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    scopes: dict[str, dict] = {}  # stack key -> {path, type, level, nodes}
    for n in nodes:
        stack = n.meta.get("nn_module_stack")
        if n.op != "call_function" or not stack:
            continue
        level = 0
        for key, (path, typ) in stack.items():
            path = _clean_path(str(path))
            if not path or path.startswith("_empty_nn_module_stack"):
                continue  # the model itself (its outputs are the graph outputs) or no module info
            level += 1
            scope = scopes.setdefault(key, {"path": path, "type": str(typ), "level": level, "nodes": []})
            scope["nodes"].append(n)

    # A buffer's new value (a functionalised in-place update) leaves the graph as state, not as
    # the module's output: such a node counts as escaping only if something else uses it.
    sig = ep.graph_signature
    mutations = set(sig.buffers_to_mutate) | set(getattr(sig, "user_inputs_to_mutate", {}) or {})
    graph_out = ep.graph.output_node()

    def escapes(n, members) -> bool:
        return any(u not in members and (u is not graph_out or n.name not in mutations or _is_user_output(n, sig)) for u in n.users)

    probes, seen_paths = [], {}
    for key, scope in scopes.items():
        if depth is not None and scope["level"] > depth:
            continue
        members = set(scope["nodes"])
        out = next(
            (n for n in reversed(scope["nodes"]) if isinstance(n.meta.get("val"), torch.Tensor) and escapes(n, members)),
            None,
        )
        if out is None:
            continue  # nothing computed inside (an Identity returns its input) or no tensor escapes
        path = scope["path"]
        calls = seen_paths[path] = seen_paths.get(path, 0) + 1
        name = path if calls == 1 else f"{path}#{calls}"  # a module called more than once
        src, code = source_of(out)
        probes.append(Probe(name, scope["type"], scope["level"], out.name, order[out], src, code))
    probes.sort(key=lambda p: (p.order, -p.level))
    return probes


def _is_user_output(node, sig) -> bool:
    from torch.export.graph_signature import OutputKind

    return any(s.kind == OutputKind.USER_OUTPUT and getattr(s.arg, "name", None) == node.name for s in sig.output_specs)


def instrument(ep: torch.export.ExportedProgram, node_names: list[str]) -> torch.export.ExportedProgram:
    """A copy of `ep` that also returns the named nodes' values: outputs become (original, (probes...)).

    The graph module is copied (it holds no weights: they are lifted into `state_dict` and
    `constants`, which the copy shares).
    """
    import torch.utils._pytree as pytree
    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument

    gm = copy.deepcopy(ep.graph_module)
    by_name = {n.name: n for n in gm.graph.nodes}
    extra = [by_name[name] for name in node_names]
    out = gm.graph.output_node()
    out.args = ((*out.args[0], *extra),)
    gm.recompile()

    sig = ep.graph_signature
    signature = ExportGraphSignature(
        input_specs=list(sig.input_specs),
        output_specs=[*sig.output_specs, *(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(name=n.name), None) for n in extra)],
    )
    orig = ep.call_spec.out_spec
    original = pytree.tree_unflatten([0] * orig.num_leaves, orig) if orig is not None else ()
    out_spec = pytree.tree_structure((original, tuple(0 for _ in extra)))
    call_graph = [
        dataclasses.replace(e, signature=dataclasses.replace(e.signature, out_spec=out_spec)) if e.fqn == "" and e.signature else e
        for e in ep.module_call_graph
    ]
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=call_graph,
        example_inputs=ep.example_inputs,
        constants=ep.constants,
        verifiers=ep.verifiers,
    )


def _check_params(store, irpa: Path | None, artifact: Path) -> None:
    """The instrumented module's parameters must all be in the artifact's archive, with the same sizes."""
    if not store.tensors:
        return
    if irpa is None:
        raise UsageError(f"--per-layer: {artifact} has no parameter archive but the model has {len(store.tensors)} weights; "
                         "the artifact was not compiled from this model")
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(irpa))
    sizes = {k: e.length for k, e in index.items()}
    for name, t in store.tensors.items():
        nbytes = t.numel() * t.element_size()
        if name not in sizes:
            raise UsageError(f"--per-layer: parameter {name!r} of the model is not in {irpa}; the artifact was not compiled from this model")
        if sizes[name] != nbytes:
            raise UsageError(
                f"--per-layer: parameter {name!r} is {sizes[name]} bytes in {irpa} but {nbytes} bytes "
                f"({t.dtype}, {list(t.shape)}) in the model; the artifact was not compiled from this model"
            )


def compile_instrumented(
    inst: torch.export.ExportedProgram, artifact_module, out_vmfb: Path, *, repro_dir: Path, strip_prefix: str | None = None
) -> None:
    """Compile `inst` as the artifact was compiled (target, arch, dtype, passes, IREE flags from its
    manifest), through compiler/lower.py like every compile.

    The weights are not written: the module runs with the artifact's .irpa (linked beside it), which
    must hold every parameter the model has, with the same size (checked before iree-compile runs).
    strip_prefix: `inst` is already in the artifact's dtype (a Llama entry point exported by
    compiler/llm.py), its parameter names carry this wrapper prefix; None: a user's f32 program,
    converted as `llmc compile` converts it.
    """
    manifest = artifact_module.manifest
    target = lower.target_of(manifest)
    plan = pipeline.build(target)
    if strip_prefix is not None:
        entry = lower.Entry(export.Exported(inst, strip_prefix), "main")
    else:
        entry = lower.export_main(inst, plan)
    lowered = lower.lower_module([entry], target, plan=plan)
    _check_params(lowered.store, artifact_module.params, artifact_module.vmfb)
    lower.write_artifact(
        lowered, out_vmfb, source=manifest["source"], phases=Phases(quiet=True), repro_dir=repro_dir,
        params_from=artifact_module.params,
    )


def localise(
    ep: torch.export.ExportedProgram,
    artifact_module,
    args: tuple,
    kwargs: dict,
    tol: dict,
    *,
    depth: int | None,
    workdir: Path,
    repro_dir: Path,
    quiet: bool = True,
    strip_prefix: str | None = None,
) -> PerLayerResult:
    """Compare every probed module output of the compiled model (artifact weights) with eager.

    strip_prefix: as compile_instrumented's; module names are shown without it (`model.layers.1.mlp`).
    """
    from llmc.runtime import load

    probes = select_probes(ep, depth)
    if strip_prefix:
        for p in probes:
            p.module = p.module.removeprefix(strip_prefix)
    if not probes:
        return PerLayerResult(depth, [], None, 0.0, None)
    unique = list(dict.fromkeys(p.node for p in probes))
    inst = instrument(ep, unique)
    manifest = artifact_module.manifest

    start = time.perf_counter()
    vmfb = workdir / "instrumented.vmfb"
    with Phases(quiet=quiet).phase("per-layer: compile the instrumented module"):
        compile_instrumented(inst, artifact_module, vmfb, repro_dir=repro_dir, strip_prefix=strip_prefix)
    seconds = time.perf_counter() - start
    irpa = artifact_module.params
    got = diff_metrics.tensor_leaves(load(vmfb)(*args, **kwargs))[-len(unique):]
    eager = diff_eager.eager_reference(inst, manifest["dtype"]) if strip_prefix is None else inst.module()
    ref = diff_metrics.tensor_leaves(diff_eager.run_eager(eager, args, kwargs))[-len(unique):]
    values = {name: (g, r) for name, g, r in zip(unique, got, ref)}

    modules = []
    for p in probes:
        g, r = values[p.node]
        modules.append(ModuleDiff(p, diff_metrics.compare(p.module, g, r, tol)))
    first = next((m for m in modules if not m.diff.passed), None)
    return PerLayerResult(depth, modules, first, seconds, str(irpa) if irpa else None)


def summary_lines(pl: PerLayerResult, verbose: bool, label: str = "per-layer") -> list[str]:
    """What `llmc diff --per-layer` prints: the count compared, every module (verbose), the first divergence."""
    depth = "every depth" if pl.depth is None else f"depth <= {pl.depth}"
    lines = [f"{label}: {len(pl.modules)} module output(s) compared ({depth}), compiled with {pl.params or 'no parameters'}"]
    for m in pl.modules if verbose else []:
        d = m.diff
        lines.append(f"  {'ok  ' if d.passed else 'FAIL'} {m.probe.module} ({m.probe.type.rsplit('.', 1)[-1]}): {diff_metrics.describe(d)}")
    if pl.first is None:
        lines.append(f"{label}: no module output over tolerance")
    else:
        p, d = pl.first.probe, pl.first.diff
        where = f" at {p.source}: {p.code}" if p.source else ""
        lines.append(f"{label}: first divergence: {p.module} ({p.type.rsplit('.', 1)[-1]}): {d.reason}{where}")
    return lines
