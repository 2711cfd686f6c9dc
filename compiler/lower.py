"""The one lowering path: exported programs + a resolved target -> MLIR -> .vmfb + .irpa + manifest.

    lowered = lower_module([Entry(exported, "main")], target, dump_ir=...)   # passes + import
    art = write_artifact(lowered, out_vmfb, source=..., phases=...)         # params, iree-compile, manifest

Every route that compiles goes through these two functions: `llmc compile` (a .pt2 or module, and a
Llama checkpoint's prefill + decode), `llmc diff` when it compiles, the instrumented module of
`--per-layer`, and every attempt of `llmc bisect`. So each of them sees exactly the passes, flags and
parameter handling of the others.

Order inside lower_module (compiler/pipeline.py lists the passes):
  graph passes on each exported program (decompositions merged into one retrace)
  -> torch-mlir import of all programs into ONE module with one ParamStore (weights external)
  -> IR passes -> the MLIR text iree-compile gets.
write_artifact then writes the parameters, runs iree-compile out of process, and writes the manifest;
all three files go to temp names and are renamed into place only when all of them exist (with any
extra files the route ships beside them, e.g. a checkpoint's tokenizer as NAME.tokenizer.json).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import re
import shutil
import tempfile
from pathlib import Path

import torch

from llmc import dtypes
from llmc.compiler import artifacts, cpu_variants, export, greedy, importer, iree, pipeline, targets, ukernels
from llmc.compiler.artifacts import Artifact
from llmc.compiler.progress import Phases
from llmc.errors import UnsupportedTargetError, UsageError
from llmc.version import __version__

log = logging.getLogger("llmc")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What `llmc compile` takes besides the model (the API's keywords and the CLI's flags)."""

    target: str = "cpu"
    arch: str | None = None
    dtype: str = "f32"
    output: Path | None = None
    dump_ir: Path | None = None
    repro_dir: Path | None = None
    extra_iree_flags: tuple[str, ...] = ()
    quiet: bool = True
    max_seq_len: int | None = None
    config: str | Path | None = None  # Llama: the config of a bare weights file (a name or a params.json/config.json)
    # Weight-only quantization (--dtype fp8 / int8): weight names (fnmatch patterns) kept in the compute
    # dtype, and whether embedding tables are quantized too (one scale per row; None: the dtype's
    # default, EMBEDDINGS_BY_DEFAULT). The quant_* and fp8_* spellings are the same options (fp8_* is
    # the older name, kept); both lists count.
    quant_exclude: tuple[str, ...] = ()
    quant_embeddings: bool | None = None
    fp8_exclude: tuple[str, ...] = ()  # = quant_exclude
    fp8_scales: str = "channel"  # --dtype fp8: "channel" (one scale per output row) or "tensor"
    fp8_embeddings: bool = False  # = quant_embeddings
    cpu_dispatch: str = "modules"  # several CPUs in --arch: "modules" or "variants" (compiler/targets.py CPU_DISPATCH)
    # PT2E int8 programs: "integer" (IREE's i8 x i8 -> i32 contractions where the arch can) or "float"
    # (Q/DQ written out as f32 math everywhere: passes/qdq_float.py)
    int8_math: str = "integer"
    tensor_parallel: int = 1  # Llama checkpoints: devices to split the model over (compiler/llm.py)
    # Llama checkpoints: static-length prefill entry points, "auto" (hip, cuda: 128, 512, 2048), or a
    # tuple of sizes (compiler/llm.py resolve_buckets)
    prefill_buckets: object = "auto"
    # Llama checkpoints: a decode_static entry point (every shape fixed, so the GPU runtime can replay
    # a recorded step): "auto", "on" or "off" (compiler/llm.py resolve_static_decode)
    static_decode: str = "auto"
    # Llama checkpoints: a prefill_chunk entry point (C tokens after cached ones, C fixed): "auto" (cpu: 64
    # when the cache holds two chunks), "none", or C (compiler/llm.py resolve_chunk)
    prefill_chunk: object = "auto"
    # Llama checkpoints: the KV cache's dtype, "auto" (bf16 for --dtype bf16 on cpu, else the compute dtype)
    # or f32 / bf16 (compiler/llm.py resolve_kv_dtype: bf16 under f32 math on cpu only)
    kv_dtype: str = "auto"

    def resolve(self) -> targets.ResolvedTarget:
        if self.int8_math not in ("integer", "float"):
            raise UsageError(f"--int8-math={self.int8_math!r}: choose integer or float")
        if self.fp8_scales not in ("channel", "tensor"):
            raise UsageError(f"--fp8-scales={self.fp8_scales!r}: choose channel or tensor")
        exclude = (*self.fp8_exclude, *self.quant_exclude)
        embeddings = True if self.fp8_embeddings else self.quant_embeddings
        if self.fp8_scales != "channel" and self.dtype != "fp8":
            raise UsageError(f"--fp8-scales applies to --dtype fp8 only (compiling {self.dtype}; int8 has one scale per output channel)")
        if (exclude or embeddings is not None) and self.dtype not in QUANTIZED_DTYPES:
            raise UsageError(f"--quant-exclude / --[no-]quant-embeddings (--fp8-exclude / --fp8-embeddings) apply to --dtype "
                             f"{' or '.join(QUANTIZED_DTYPES)} only (compiling {self.dtype})")
        if embeddings is None:
            embeddings = EMBEDDINGS_BY_DEFAULT.get(self.dtype, False)
        if not isinstance(self.tensor_parallel, int) or self.tensor_parallel < 1:
            raise UsageError(f"--tensor-parallel={self.tensor_parallel!r}: give a device count of 1 or more")
        r = targets.resolve(self.target, self.arch, self.dtype, extra_flags=tuple(self.extra_iree_flags), cpu_dispatch=self.cpu_dispatch,
                            devices=self.tensor_parallel)
        # The pass options each dtype's pass reads (passes/_quantized_weights.py: the codec's prefix).
        if self.dtype == "fp8":
            opts = {"fp8_exclude": exclude, "fp8_scales": self.fp8_scales, "fp8_embeddings": embeddings}
        elif self.dtype == "int8":
            opts = {"quant_exclude": exclude, "quant_embeddings": embeddings}
        else:
            opts = {}
        if self.int8_math != "integer":
            opts["int8_math"] = self.int8_math
        return dataclasses.replace(r, pass_options=tuple(opts.items()))


QUANTIZED_DTYPES = ("fp8", "int8")  # --dtype values that quantize weights (weight-only, per-channel scales)
# Whether a quantized dtype quantizes embedding tables when neither --quant-embeddings nor
# --no-quant-embeddings is given. int8: yes. Left in f32, the table is a third of the tiny Llama's
# int8 .irpa (0.38x of the f32 build's bytes; 0.29x with the table in int8), and an int8 row with
# its own scale is within half a step (amax / 254) of each entry, as the linears are. fp8: no (its
# default predates the option, and E4M3's 3-bit mantissa costs an embedding row more).
EMBEDDINGS_BY_DEFAULT = {"int8": True, "fp8": False}


@dataclasses.dataclass
class Entry:
    """One exported function of the module."""

    exported: export.Exported
    function: str
    tied: dict[int, int] | None = None  # result index -> argument index (iree.abi.tied)
    logits_output: int | None = None  # the output child that holds logits (for diff's checks)
    # A multi-device module (--tensor-parallel): the device of each argument / result given by index;
    # the others are device 0's (importer.DevicePlan)
    arg_devices: dict[int, int] | None = None
    result_devices: dict[int, int] | None = None
    # also emit greedy.greedy_name(function): this function plus the greedy token of its logits row
    # (compiler/greedy.py), added after the IR passes; needs logits_output
    greedy: bool = False


@dataclasses.dataclass
class Lowered:
    mlir: str
    store: importer.ParamStore
    mutable: list[str]
    signatures: dict[str, dict]
    plan: pipeline.Plan
    target: targets.ResolvedTarget
    # A --cpu-dispatch modules build's text for each CPU but the last, linked for that CPU (ukernels.link
    # chooses the C functions and stream counts by CPU); `mlir` is the main module's, the last CPU's.
    # Empty: not such a build, or no kernel calls (every module compiles `mlir`).
    cpu_mlir: dict[str, str] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Output paths


def output_path(output, default_stem: str, inputs: list[Path] = ()) -> Path:
    """The .vmfb path to write (NAME.irpa and NAME.json go beside it); checked before any work.

    inputs: files the compile reads. No output may be one of them: `llmc compile config.json` in an
    HF folder would otherwise write its manifest over the checkpoint's own config.json.
    """
    output = Path(output) if output is not None else Path.cwd() / f"{default_stem}.vmfb"
    if output.suffix != ".vmfb":
        raise UsageError(f"-o {output}: the output must be a .vmfb path (NAME.irpa and NAME.json go beside it)")
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: output directory {output.parent} does not exist; create it first")
    if not os.access(output.parent, os.W_OK):
        raise UsageError(f"-o {output}: output directory {output.parent} is not writable")
    for out in (output, output.with_suffix(".irpa"), output.with_suffix(".json")):
        for src in inputs:
            if out.exists() and src.exists() and os.path.samefile(out, src):
                raise UsageError(
                    f"{out} is an input of this compile (the model reads it); writing the artifact there would "
                    f"destroy it: name the output with -o, e.g. -o {output.parent / ('llmc-' + output.stem)}.vmfb"
                )
    return output


# ---------------------------------------------------------------------------------------------
# Lowering


def export_main(model, plan: pipeline.Plan, example_args: tuple = (), example_kwargs=None, dynamic_shapes=None) -> Entry:
    """A user's model (nn.Module, ExportedProgram) exported in the plan's dtype as the `main` entry
    point; the plan's source passes run on an f32 program's graph before it is re-exported."""
    exported = export.export_model(
        model, tuple(example_args), example_kwargs, dtype=plan.ctx.target.compute_dtype, dynamic_shapes=dynamic_shapes,
        source_passes=lambda gm: pipeline.run_source(plan, gm),
    )
    from llmc.passes._base import has_qdq

    target = plan.ctx.target
    if not target.arch_caps.int8_storage and has_qdq(exported.program):
        raise UnsupportedTargetError(
            f"--target {target.name} --arch {target.arch}: this int8 (PT2E) program cannot be compiled for a device without "
            "8-bit storage buffers (IREE cannot load an int8 tensor there); compile the float model for it, or an arch with 8-bit storage"
        )
    return Entry(exported, "main")


def lower_module(
    entries: list[Entry],
    target: targets.ResolvedTarget,
    *,
    dump_ir=None,
    phases: Phases | None = None,
    graph_passes: bool = True,
    plan: pipeline.Plan | None = None,
    param_device=None,
) -> Lowered:
    """Graph passes, import and IR passes: the MLIR text iree-compile gets, and its parameters.

    graph_passes=False: the programs already went through them (bisect lowers sub-programs of a
    program it decomposed once). plan: the pass plan, when the caller already ran its source passes.
    param_device: on several devices (target.devices > 1), name -> the device a parameter is pinned to
    (or None: IREE places it by its uses).
    Raises llmc.errors.CompileError (torch-mlir import) or PassError (a pass refused or failed).
    """
    phases = phases or Phases(quiet=True)
    plan = plan or pipeline.build(target)
    dump = pipeline.Dumper(dump_ir) if dump_ir is not None else None
    programs = []
    with phases.phase("graph passes"):
        for e in entries:
            program = (pipeline.run_graph(plan, e.exported.program, e.function, dump, name_prefix=e.exported.strip_prefix or "",
                                          tied_outputs=e.tied or ())
                       if graph_passes else e.exported.program)
            programs.append(export.Exported(program, e.exported.strip_prefix))
    target = target.for_shapes(any(export.is_dynamic(p.program) for p in programs))
    plan.ctx.target = target
    signatures = {}
    for e, p in zip(entries, programs):
        sig = artifacts.entry_signature(p.program, e.function)
        if e.logits_output is not None:
            sig["outputs"]["children"][e.logits_output]["role"] = "logits"
        signatures[e.function] = sig
    tied = {e.function: e.tied for e in entries if e.tied}
    devices = None
    if target.devices > 1:
        devices = importer.DevicePlan(target.devices, {e.function: e.arg_devices or {} for e in entries},
                                      {e.function: e.result_devices or {} for e in entries}, param_device)
    with phases.phase("import"):
        module, store, mutable = importer.import_programs([(p, e.function) for p, e in zip(programs, entries)], tied or None, devices)
    plan.ctx.params = store
    with phases.phase("ir passes"):
        pipeline.run_ir(plan, module, dump)
        for e in entries:
            if e.greedy:
                name = greedy.greedy_name(e.function)
                added = greedy.add_greedy(module, e.function, name, e.logits_output)
                signatures[name] = greedy.signature(signatures[e.function], name, next_token=added)
        if target.module_target:
            _write_device_targets(module, target.module_target)
        mlir = str(module)
        # cpus: llvm-cpu only; a --cpu-dispatch modules build's main .vmfb is its last CPU's alone (the others: below)
        linked = ukernels.link(mlir, arch=(target.cpus[-1] if target.cpu_modules else target.arch) if target.cpus else None)
        cpu_mlir = ({cpu: ukernels.link(mlir, arch=cpu) for cpu in target.cpus[:-1]}
                    if linked is not mlir and target.cpu_modules else {})  # each other CPU's module, linked for it
        if dump is not None and linked is not mlir:
            for cpu, text in cpu_mlir.items():  # before the main text, which stays the last dump
                dump(f"cpu-kernels-{cpu}", lambda text=text: text)
            dump("cpu-kernels", lambda: linked)  # the text iree-compile gets: the kernels' dispatches and executable
        mlir = linked
    return Lowered(mlir, store, mutable, signatures, plan, target, cpu_mlir)


_KEEP_F64 = "--iree-input-demote-f64-to-f32=false"
_F64_TENSOR = re.compile(r"tensor<[^>]*f64")  # !torch.vtensor<[4],f64>, tensor<4xf64>, complex<f64> elements


def compile_flags(target: targets.ResolvedTarget, mlir: str) -> list[str]:
    """iree-compile's flags for this program: the target's, without keeping f64 when the program has
    no f64 tensor. Kept, f64 *scalars* (a float `arange` bound, a PT2E quantization scale: Python
    floats, f64 in torch-mlir) fail in IREE 3.13: "failed to legalize operation 'arith.truncf' ...
    (f64) -> f32". Demoted, they are f32, which is what eager PyTorch computes a scalar with against
    an f32 tensor."""
    flags = list(target.iree_flags)
    if _KEEP_F64 in flags and not _F64_TENSOR.search(mlir):
        flags.remove(_KEEP_F64)
    return flags


def _write_device_targets(module, attr: str) -> None:
    """Put the target IREE's table lacks (Intel profiles, sm_90) on the module as its
    `hal.device.targets`; iree-compile then needs no target flags (compiler/targets.py)."""
    from torch_mlir import ir

    with module.context:
        module.context.allow_unregistered_dialects = True  # hal/iree_gpu attributes stay opaque here
        module.operation.attributes["hal.device.targets"] = ir.Attribute.parse(attr)


def write_artifact(
    lowered: Lowered,
    out_vmfb: Path,
    *,
    source: dict,
    phases: Phases,
    repro_dir=None,
    extra_manifest: dict | None = None,
    params_from: Path | None = None,
    extra_files: list[tuple[Path | None, str]] = (),
) -> Artifact:
    """Write the parameters, run iree-compile and write the manifest, all three into place at once.

    params_from: an existing .irpa to run with instead of writing one (per-layer's instrumented module
    reads the artifact's own weights); it is linked beside the output.
    extra_files: (source, suffix) pairs: the source is copied to NAME + suffix (".tokenizer.json" ->
    NAME.tokenizer.json) and moved into place with the rest. A None source means this artifact has no
    such file: one left by an earlier compile of NAME is removed, so load() cannot pick it up.
    """
    out_vmfb = Path(out_vmfb)
    name = out_vmfb.stem
    out_irpa, out_json = out_vmfb.with_suffix(".irpa"), out_vmfb.with_suffix(".json")
    store, target = lowered.store, lowered.target
    has_params = bool(store.tensors)
    partial_vmfb = out_vmfb.with_name(f".{name}.partial.vmfb")
    tmp_irpa = artifacts.temp_path(out_irpa) if has_params and params_from is None else None
    manifest_tmp = None
    tmp_dir = None  # the CPU probe or the other CPUs' modules, before they are moved into place
    extras: list[tuple[Path | None, Path]] = []  # (source or None, final path)
    extra_tmps: dict[Path, Path] = {}  # final path -> its temp copy
    for src, suffix in extra_files:
        dest = out_vmfb.with_name(name + suffix)
        if dest in (out_vmfb, out_irpa, out_json) or "/" in suffix:
            raise ValueError(f"extra file suffix {suffix!r} names one of the artifact's own files or another folder")
        extras.append((None if src is None else Path(src), dest))
    try:
        if tmp_irpa is not None:
            # IREE writes the archive in one call: its growing size on disk is the progress.
            with phases.phase("write parameters", progress=lambda: (tmp_irpa.stat().st_size, store.nbytes)):
                store.write_irpa(tmp_irpa)
            # The pass scratch files (passes/_scratch.py) are in the archive now; their mappings outlive them.
            if lowered.plan.ctx.scratch is not None:
                lowered.plan.ctx.scratch.close()
            hashed = [0]
            size = tmp_irpa.stat().st_size
            with phases.phase("hash parameters", progress=lambda: (hashed[0], size)):
                irpa_sha = artifacts.sha256_file(tmp_irpa, counter=hashed)
        else:
            irpa_sha = None
        configure, conditions = None, None
        if len(target.cpus) > 1:
            conditions = targets.cpu_variant_conditions(target.cpus)
            if not target.cpu_modules:
                configure = lambda text: cpu_variants.condition_variants(text, conditions)  # noqa: E731
        cpu_modules = {}
        with phases.phase("iree-compile" + (f" ({target.cpus[-1]})" if target.cpu_modules else "")):
            run = iree.compile_mlir(
                lowered.mlir,
                partial_vmfb,
                compile_flags(target, lowered.mlir),
                repro_dir=Path(repro_dir) if repro_dir else out_vmfb.parent,
                target_name=target.name,
                configure=configure,
            )
        if target.cpu_modules:
            # One module per CPU, best first; the main .vmfb is the last (the fallback), each other
            # CPU's is NAME.<cpu>.vmfb beside it. llmc.load runs the best one the CPU can (runtime/module.py).
            cpu_modules[target.cpus[-1]] = ".vmfb"  # suffixes of the artifact's stem: renaming it keeps them found
            tmp_dir = Path(tempfile.mkdtemp(prefix="llmc-cpu-modules-"))
            for cpu in target.cpus[:-1]:
                with phases.phase(f"iree-compile ({cpu})"):
                    path = tmp_dir / f"{cpu}.vmfb"
                    text = lowered.cpu_mlir.get(cpu, lowered.mlir)
                    iree.compile_mlir(text, path, compile_flags(target.for_cpu(cpu), text),
                                      repro_dir=Path(repro_dir) if repro_dir else out_vmfb.parent, target_name=target.name)
                cpu_modules[cpu] = f".{cpu}.vmfb"
                extras.append((path, out_vmfb.with_name(name + cpu_modules[cpu])))
        for old in out_vmfb.parent.glob(f"{name}.*.vmfb"):  # another CPU's module from an earlier compile
            cpu = old.name[len(name) + 1:-len(".vmfb")]
            if cpu in targets.X86_CPUS and cpu not in cpu_modules:
                extras.append((None, old))
        if configure is not None:  # the probe the runtime loads first (compiler/cpu_variants.py)
            with phases.phase("iree-compile (cpu probe)"):
                tmp_dir = Path(tempfile.mkdtemp(prefix="llmc-probe-"))
                probe = tmp_dir / "probe.vmfb"
                fallback = targets.resolve("cpu", target.cpus[-1], "f32")
                iree.compile_mlir(cpu_variants.PROBE_MLIR, probe, list(fallback.iree_flags),
                                  repro_dir=Path(repro_dir) if repro_dir else out_vmfb.parent, target_name=target.name)
                extras.append((probe, out_vmfb.with_name(name + cpu_variants.PROBE_SUFFIX)))
        else:
            extras.append((None, out_vmfb.with_name(name + cpu_variants.PROBE_SUFFIX)))
        with phases.phase("write manifest"):
            for src, dest in extras:
                if src is not None:
                    extra_tmps[dest] = artifacts.temp_path(dest)
                    shutil.copyfile(src, extra_tmps[dest])
            manifest = _manifest(lowered, source, run, irpa_sha, out_irpa if has_params else None, phases, name, conditions, cpu_modules)
            manifest.update(extra_manifest or {})
            manifest_tmp = artifacts.temp_path(out_json)
            manifest_tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        # All three exist: move them into place (parameters first, manifest last).
        if tmp_irpa is not None:
            os.replace(tmp_irpa, out_irpa)
        elif params_from is not None and has_params:
            if out_irpa.exists() or out_irpa.is_symlink():
                out_irpa.unlink()
            os.symlink(Path(params_from).resolve(), out_irpa)
        elif out_irpa.exists():
            out_irpa.unlink()  # a stale archive from an earlier compile would be picked up by load()
        for src, dest in extras:
            if src is not None:
                os.replace(extra_tmps[dest], dest)
            elif dest.exists() or dest.is_symlink():
                dest.unlink()  # stale, like the archive above
        os.replace(partial_vmfb, out_vmfb)
        os.replace(manifest_tmp, out_json)
    finally:
        for p in (tmp_irpa, partial_vmfb, manifest_tmp, *extra_tmps.values()):
            if p is not None and Path(p).exists():
                Path(p).unlink()
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("compiled %s in %s", out_vmfb, ", ".join(f"{k} {v:.1f}s" for k, v in phases.timings.items()))
    return Artifact(out_vmfb, out_irpa if has_params else None, out_json)


def target_of(manifest: dict) -> targets.ResolvedTarget:
    """The resolved target an artifact was compiled for, from its manifest (per-layer recompiles with it)."""
    t = manifest["target"]
    # A manifest from before --cpu-dispatch with several CPUs had executable variants (and a probe).
    dispatch = t.get("cpu_dispatch") or ("variants" if t.get("cpu_variants") else "modules")
    base = targets.resolve(t["name"], t["arch"], manifest["dtype"], cpu_dispatch=dispatch)
    base = dataclasses.replace(base, pass_options=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in t.get("pass_options", {}).items()))
    # The recorded flags win: whatever the manifest lists beyond llmc's own flags is kept as extra.
    own = {"--iree-input-type=torch", *base.iree_flags, *base.for_shapes(True).iree_flags}
    extra = tuple(f for f in manifest.get("iree_flags", ()) if f not in own)
    return dataclasses.replace(base, extra_flags=extra)


def runtime_device(caps: targets.TargetCaps) -> str:
    """The IREE runtime device a target's modules run on by default."""
    return "local-task" if caps.device == "local" else caps.device


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"llmc": __version__, "torch": torch.__version__}
    for pkg in ("iree-base-compiler", "iree-base-runtime", "torch-mlir"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _manifest(lowered: Lowered, source: dict, run, irpa_sha: str | None, out_irpa: Path | None, phases: Phases, out_vmfb_name: str,
              cpu_conditions: list | None = None, cpu_modules: dict | None = None) -> dict:
    target, store, signatures = lowered.target, lowered.store, lowered.signatures
    caps = target.caps
    wide = ("float64", "complex128")
    uses_f64 = any(e.get("dtype") in wide for sig in signatures.values() for e in sig["inputs"]) or any(
        dtypes.name_of(x.dtype) in wide for x in store.tensors.values()
    )
    t = {
        "name": caps.name,
        "device": caps.device,
        "backend": caps.backend,
        "arch": target.arch,
        "dtype_mode": caps.dtype_mode(target.dtype),
        "attention": caps.attention,
        "extra_iree_flags": list(target.extra_flags),
        "pass_options": {k: list(v) if isinstance(v, tuple) else v for k, v in target.pass_options},
    }
    if target.devices > 1:
        t["devices"] = target.devices  # @__device_0..N-1: the runtime opens N devices (runtime/module.py)
    if caps.backend == "llvm-cpu":
        t["machine"] = platform.machine()
        # What a machine needs to run the module: the (last, fallback) CPU's features.
        t["cpu"], features = targets.llvm_cpu_features(target.cpus[-1])
        t["cpu_features"] = list(features)
        if cpu_conditions:  # several CPUs: what each variant asks of the running CPU (compiler/cpu_variants.py)
            t["cpu_dispatch"] = "modules" if cpu_modules else "variants"
            t["cpu_variants"] = [{"cpu": cpu, "requires": list(req)} for cpu, req in cpu_conditions]
            if cpu_modules:  # one module per CPU: each file's suffix after the stem (the main .vmfb is the last CPU's)
                t["cpu_modules"] = dict(cpu_modules)
            else:
                t["cpu_probe"] = out_vmfb_name + cpu_variants.PROBE_SUFFIX
    else:
        a = target.arch_caps
        t["iree_target"] = a.iree_name or "written into the module (hal.device.targets)"
        # What the runtime checks against the device before it runs anything (runtime/device.py).
        t["requires"] = {
            "subgroup_sizes": list(a.subgroup_sizes),
            "float16": target.compute_dtype == "f16",
            "float64": a.f64 and uses_f64,
        }
    params = None
    if out_irpa is not None:
        params = {
            "file": out_irpa.name,
            "scope": importer.PARAM_SCOPE,
            "count": len(store.tensors),
            "bytes": store.nbytes,
            "sha256": irpa_sha,
            "mutable_state": lowered.mutable,
        }
    return {
        "format": "llmc-manifest/1",
        "versions": _versions(),
        "source": source,
        "target": t,
        "dtype": target.dtype,
        "compute_dtype": target.compute_dtype,
        "f64": ("kept (--iree-input-demote-f64-to-f32=false)" if target.arch_caps.f64 else "demoted to f32 (the arch has no f64)")
        if uses_f64
        else "not used",
        "iree_flags": ["--iree-input-type=torch", *compile_flags(target, lowered.mlir)],
        "passes": lowered.plan.stats(),
        "passes_skipped": lowered.plan.skipped,
        **lowered.plan.ctx.records,
        "entry_points": signatures,
        "default_entry": next(iter(signatures)),
        "runtime_device": runtime_device(caps),
        "params": params,
        "compile": {
            "seconds": {k: round(v, 3) for k, v in phases.timings.items()},
            "iree_compile_peak_rss_mb": round(run.peak_rss_mb, 1),
        },
    }
