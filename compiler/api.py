"""llmc.compile: model -> torch.export -> torch-mlir -> passes -> iree-compile -> .vmfb + .irpa + .json."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
from pathlib import Path

import torch

import llmc
from llmc.compiler import artifacts, export, importer, iree, pipeline, targets
from llmc.compiler.artifacts import Artifact
from llmc.compiler.progress import Phases
from llmc.errors import UsageError

log = logging.getLogger("llmc")


def _output_paths(output, model) -> tuple[Path, str]:
    if output is None:
        stem = Path(model).stem if isinstance(model, (str, os.PathLike)) else "model"
        output = Path.cwd() / f"{stem}.vmfb"
    output = Path(output)
    if output.suffix != ".vmfb":
        raise UsageError(f"-o {output}: the output must be a .vmfb path (NAME.irpa and NAME.json go beside it)")
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: output directory {output.parent} does not exist; create it first")
    if not os.access(output.parent, os.W_OK):
        raise UsageError(f"-o {output}: output directory {output.parent} is not writable")
    return output, output.stem


def _source_info(model) -> dict:
    if isinstance(model, (str, os.PathLike)):
        p = Path(model)
        return {"kind": p.suffix.lstrip(".") or "path", "path": str(p.resolve()), "sha256": artifacts.sha256_file(p)}
    return {"kind": type(model).__name__}


def compile_model(
    model,
    example_args: tuple = (),
    *,
    target: str = "cpu",
    dtype: str = "f32",
    arch: str | None = None,
    output=None,
    example_kwargs: dict | None = None,
    dynamic_shapes=None,
    dump_ir=None,
    repro_dir=None,
    extra_iree_flags: tuple[str, ...] = (),
    quiet: bool = True,
    max_seq_len: int | None = None,
) -> Artifact:
    """Compile `model` for `target` in `dtype`.

    model: an nn.Module (with example_args), an ExportedProgram, a path to a .pt2 file, or a Llama
    checkpoint (a Meta .pth/.pt with params.json beside it, its folder, or an HF folder) or an llmc
    `Llama` module without example_args: those become a prefill + decode module with a KV cache of
    `max_seq_len` positions (compiler/llm.py).
    dynamic_shapes: as torch.export takes it, e.g. ({1: torch.export.Dim("seq", min=2, max=4096)},).
    output: NAME.vmfb; NAME.irpa (weights) and NAME.json (manifest) are written beside it.
    Raises llmc.errors.LlmcError subclasses: UsageError and friends for bad input (exit 2),
    CompileError when torch-mlir or iree-compile fails (exit 3, reproducer written).
    extra_iree_flags: appended after llmc's own flags (later flags win); recorded in the manifest.
    """
    from llmc.compiler import llm
    from llmc.models.llama.model import Llama

    is_checkpoint = isinstance(model, (str, os.PathLike)) and Path(model).suffix != ".pt2" and Path(model).exists() and llm.is_llama_checkpoint(Path(model))
    if is_checkpoint or (isinstance(model, Llama) and not example_args and not example_kwargs):
        return llm.compile_llm(
            model, target=target, dtype=dtype, arch=arch, output=output, max_seq_len=max_seq_len,
            dump_ir=dump_ir, repro_dir=repro_dir, extra_iree_flags=extra_iree_flags, quiet=quiet,
        )
    if max_seq_len is not None:
        raise UsageError(f"--max-seq-len applies to Llama checkpoints; {model if isinstance(model, (str, os.PathLike)) else type(model).__name__} is not one")
    # Validate everything cheap before any expensive work.
    probe = targets.resolve(target, arch, dtype)
    out_vmfb, _ = _output_paths(output, model)
    source = {"kind": type(model).__name__}
    if isinstance(model, (str, os.PathLike)):
        if not Path(model).exists():
            raise UsageError(f"{model}: no such file or directory")
        source = _source_info(model)
        if Path(model).suffix == ".pt2":
            model = export.load_pt2(Path(model))  # bad files fail here, before any progress output
    phases = Phases(quiet=quiet)

    with phases.phase("export"):
        exported = export.export_model(
            model,
            tuple(example_args),
            example_kwargs,
            dtype=dtype,
            dynamic_shapes=dynamic_shapes,
            attention=probe.caps.attention,
        )
    resolved = with_extra_flags(targets.resolve(target, arch, dtype, dynamic=export.is_dynamic(exported.program)), extra_iree_flags)
    signature = artifacts.entry_signature(exported.program, "main")
    return build_artifact(
        [(exported, "main", signature)],
        resolved=resolved,
        source=source,
        out_vmfb=out_vmfb,
        phases=phases,
        dump_ir=dump_ir,
        repro_dir=repro_dir,
    )


def with_extra_flags(resolved, extra_iree_flags):
    if not extra_iree_flags:
        return resolved
    bad = [f for f in extra_iree_flags if not f.startswith("--")]
    if bad:
        raise UsageError(f"--iree-flag {bad[0]!r}: IREE flags start with '--', e.g. --iree-flag=--iree-opt-level=O3")
    return dataclasses.replace(resolved, iree_flags=(*resolved.iree_flags, *extra_iree_flags))


def build_artifact(
    entries,
    *,
    resolved,
    source: dict,
    out_vmfb: Path,
    phases: Phases,
    dump_ir=None,
    repro_dir=None,
    tied_results: dict | None = None,
    extra_manifest: dict | None = None,
) -> Artifact:
    """Import exported programs into one module, run the passes, write .irpa, compile, write the manifest.

    entries: [(Exported, function name, signature)]; the first is the default entry point.
    All three files are written to temp names and renamed into place only when all of them exist.
    """
    name = out_vmfb.stem
    out_irpa, out_json = out_vmfb.with_suffix(".irpa"), out_vmfb.with_suffix(".json")
    with phases.phase("import"):
        module, store, mutable = importer.import_programs([(e, f) for e, f, _ in entries], tied_results)

    with phases.phase("passes"):
        passes, skipped = pipeline.build(resolved.caps.backend, resolved.dtype)
        stats = pipeline.run_passes(module, passes, Path(dump_ir) if dump_ir else None)
        mlir_text = str(module)
    del module

    partial_vmfb = out_vmfb.with_name(f".{name}.partial.vmfb")
    tmp_irpa = artifacts.temp_path(out_irpa) if store.tensors else None
    try:
        if tmp_irpa is not None:
            with phases.phase("write parameters"):
                store.write_irpa(tmp_irpa)
        with phases.phase("iree-compile"):
            run = iree.compile_mlir(
                mlir_text,
                partial_vmfb,
                list(resolved.iree_flags),
                repro_dir=Path(repro_dir) if repro_dir else out_vmfb.parent,
                target_name=resolved.name,
            )
        with phases.phase("write manifest"):
            signatures = {f: sig for _, f, sig in entries}
            manifest = _manifest(
                source, resolved, signatures, store, mutable, stats, skipped, run, tmp_irpa, out_irpa, phases
            )
            manifest.update(extra_manifest or {})
            manifest_tmp = artifacts.temp_path(out_json)
            manifest_tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        # All three exist: move them into place (parameters first, manifest last).
        if tmp_irpa is not None:
            os.replace(tmp_irpa, out_irpa)
        elif out_irpa.exists():
            out_irpa.unlink()  # a stale archive from an earlier compile would be picked up by load()
        os.replace(partial_vmfb, out_vmfb)
        os.replace(manifest_tmp, out_json)
    finally:
        for p in (tmp_irpa, partial_vmfb):
            if p is not None and Path(p).exists():
                Path(p).unlink()
    log.info("compiled %s in %s", out_vmfb, ", ".join(f"{k} {v:.1f}s" for k, v in phases.timings.items()))
    return Artifact(out_vmfb, out_irpa if store.tensors else None, out_json)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"llmc": llmc.__version__, "torch": torch.__version__}
    for pkg in ("iree-base-compiler", "iree-base-runtime", "torch-mlir"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _manifest(source, resolved, signatures, store, mutable, stats, skipped, run, tmp_irpa, out_irpa, phases) -> dict:
    caps = resolved.caps
    target = {
        "name": caps.name,
        "device": caps.device,
        "backend": caps.backend,
        "arch": resolved.arch,
        "dtype_mode": caps.dtype_mode(resolved.dtype),
        "attention": caps.attention,
    }
    if caps.backend == "llvm-cpu":
        target["machine"] = platform.machine()
        target["cpu"], features = targets.llvm_cpu_features(resolved.arch)
        target["cpu_features"] = list(features)
    params = None
    if tmp_irpa is not None:
        params = {
            "file": out_irpa.name,
            "scope": importer.PARAM_SCOPE,
            "count": len(store.tensors),
            "bytes": store.nbytes,
            "sha256": artifacts.sha256_file(tmp_irpa),
            "mutable_state": mutable,
        }
    uses_f64 = any(
        e.get("dtype") in ("float64", "complex128") for sig in signatures.values() for e in sig["inputs"]
    ) or any(t.dtype == torch.float64 for t in store.tensors.values())
    return {
        "format": "llmc-manifest/1",
        "versions": _versions(),
        "source": source,
        "target": target,
        "dtype": resolved.dtype,
        "f64": "kept (--iree-input-demote-f64-to-f32=false)" if uses_f64 else "not used",
        "iree_flags": ["--iree-input-type=torch", *resolved.iree_flags],
        "passes": [s.as_dict() for s in stats],
        "passes_skipped": skipped,
        "entry_points": signatures,
        "default_entry": next(iter(signatures)),
        "runtime_device": "local-task" if caps.device == "local" else caps.device,
        "params": params,
        "compile": {
            "seconds": {k: round(v, 3) for k, v in phases.timings.items()},
            "iree_compile_peak_rss_mb": round(run.peak_rss_mb, 1),
        },
    }
