"""llmc.compile: the public compile API. Chooses the route and hands it to the one lowering path.

    model -> torch.export (compiler/export.py) -> compiler/lower.py -> .vmfb + .irpa + .json

Two routes, one lowering: a .pt2 / ExportedProgram / nn.Module with example args becomes a `main`
entry point; a Llama checkpoint (or an llmc Llama without example args) becomes `prefill` + `decode`
with a KV cache (compiler/llm.py). Both validate everything cheap (target, dtype, output path, input
file) before any expensive work, and resolve the target once.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmc.compiler import artifacts, export, lower, pipeline, targets
from llmc.compiler.artifacts import Artifact
from llmc.compiler.progress import Phases, quiet_pytree_warnings
from llmc.errors import UsageError


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
    config=None,
    quant_exclude: tuple[str, ...] = (),
    quant_embeddings: bool | None = None,
    fp8_exclude: tuple[str, ...] = (),
    fp8_scales: str = "channel",
    fp8_embeddings: bool = False,
    cpu_dispatch: str = "modules",
    int8_math: str = "integer",
    tensor_parallel: int = 1,
    prefill_buckets="auto",
    static_decode: str = "auto",
    prefill_chunk="auto",
    kv_dtype: str = "auto",
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
    config: a Llama state dict saved on its own (a .pt/.pth/.safetensors with no params.json or
    config.json beside it) needs its config: a name (`llama3-8b`, see models/llama/config.py) or a
    params.json / config.json path.
    quant_exclude (--dtype fp8 or int8): weight names (fnmatch patterns, e.g. "lm_head.*") kept in
    the compute dtype; quant_embeddings: embedding tables quantized too (one scale per row); None: the
    dtype's default (int8 yes, fp8 no: lower.EMBEDDINGS_BY_DEFAULT).
    fp8_exclude / fp8_embeddings: the older names of the same two options (both spellings count).
    fp8_scales (--dtype fp8): one scale per output channel ("channel") or per tensor ("tensor").
    cpu_dispatch: with several CPUs in `arch` (e.g. "portable"): "modules" writes one .vmfb per CPU
    sharing the .irpa (NAME.vmfb is the last CPU's, NAME.<cpu>.vmfb the others'; llmc.load runs the
    best this CPU can), "variants" one .vmfb with an executable variant per CPU (IREE picks at load;
    no data tiling in IREE 3.13, so f32 matmuls are slower).
    int8_math (int8 PT2E programs): "integer" (i8 x i8 -> i32 contractions where the arch can) or
    "float" (quantize / dequantize as f32 math, contractions in f32: docs/int8.md).
    tensor_parallel (Llama checkpoints): split the model over this many devices of the target, one
    module holding the copies between them (docs/tensor-parallel.md); llmc.load opens that many.
    prefill_buckets (Llama checkpoints): prompt sizes that get a prefill entry point of their own with
    the length fixed (the prompt padded to it): "auto" (hip and cuda: 128, 512 and 2048 up to
    max_seq_len; none on cpu, vulkan and xpu), "none", a list such as (128, 512), or the CLI's text "128,512".
    static_decode (Llama checkpoints): "on" adds `decode_static`, a decode step with every shape fixed
    that generate() uses for its steps, "off" leaves it out, "auto" picks per target (compiler/llm.py).
    prefill_chunk (Llama checkpoints, cpu): C adds `prefill_chunk`, C prompt tokens after the cached ones
    with C fixed (every matmul a static M, as in a bucket) and no padding: generate() prefills the first
    P mod C tokens of a P-token prompt with the dynamic prefill and the rest C at a time. "auto" (the
    default): 64 on cpu when max_seq_len holds two chunks (bf16/fp8/int8 weights: only where llmc's C
    kernels serve, compiler/ukernels.py), else none; "none" or 0: none.
    kv_dtype (Llama checkpoints): the KV cache's dtype: "auto" (bf16 for --dtype bf16 on cpu, else the compute
    dtype), "f32", or "bf16" (cpu: K/V rows rounded to bf16 as they are written and widened exactly as
    attention reads them, math in f32; half the cache's memory and half the bytes a decode step's attention
    reads: docs/architecture.md "KV cache dtype").
    """
    opts = lower.CompileOptions(
        target=target, arch=arch, dtype=dtype, output=Path(output) if output is not None else None,
        dump_ir=Path(dump_ir) if dump_ir is not None else None, repro_dir=Path(repro_dir) if repro_dir is not None else None,
        extra_iree_flags=tuple(extra_iree_flags), quiet=quiet, max_seq_len=max_seq_len, config=config,
        quant_exclude=_patterns(quant_exclude), quant_embeddings=quant_embeddings,
        fp8_exclude=_patterns(fp8_exclude), fp8_scales=fp8_scales, fp8_embeddings=fp8_embeddings,
        cpu_dispatch=cpu_dispatch, int8_math=int8_math, tensor_parallel=tensor_parallel, prefill_buckets=prefill_buckets,
        static_decode=static_decode, prefill_chunk=prefill_chunk, kv_dtype=kv_dtype,
    )
    opts.resolve()  # bad target, dtype or quantization options fail before anything is loaded
    buckets = targets.parse_buckets(prefill_buckets)  # so does a malformed --prefill-buckets
    targets.check_static_decode(static_decode)
    chunk = targets.parse_chunk(prefill_chunk)
    kv = targets.parse_kv_dtype(kv_dtype)
    if isinstance(model, (str, os.PathLike)) and not Path(model).exists():
        raise UsageError(f"{model}: no such file or directory")
    from llmc.compiler import llm

    if llm.is_llm_source(model, example_args, example_kwargs, config):
        with quiet_pytree_warnings():
            return llm.compile_llm(model, opts)
    what = model if isinstance(model, (str, os.PathLike)) else type(model).__name__
    if config is not None:
        raise UsageError(f"--config applies to Llama weights files; {what} is not one")
    if max_seq_len is not None:
        raise UsageError(f"--max-seq-len applies to Llama checkpoints; {what} is not one")
    if tensor_parallel != 1:
        raise UsageError(f"--tensor-parallel applies to Llama checkpoints; {what} is not one")
    if buckets != "auto":
        raise UsageError(f"--prefill-buckets applies to Llama checkpoints; {what} is not one")
    if static_decode != "auto":
        raise UsageError(f"--static-decode applies to Llama checkpoints; {what} is not one")
    if chunk != "auto":
        raise UsageError(f"--prefill-chunk applies to Llama checkpoints; {what} is not one")
    if kv != "auto":
        raise UsageError(f"--kv-dtype applies to Llama checkpoints; {what} is not one")
    with quiet_pytree_warnings():
        return compile_program(model, tuple(example_args), example_kwargs, dynamic_shapes, opts)


def compile_program(model, example_args: tuple, example_kwargs, dynamic_shapes, opts: lower.CompileOptions) -> Artifact:
    """A .pt2 path, ExportedProgram or nn.Module -> one `main` entry point."""
    from llmc.compiler import llm

    target = opts.resolve()
    source, inputs, stem = {"kind": type(model).__name__}, [], "model"
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if path.suffix != ".pt2":
            from llmc.models.llama import loaders

            raise UsageError(f"{path}: {loaders.why_not_checkpoint(path)}")
        source = {"kind": path.suffix.lstrip(".") or "path", "path": str(path.resolve()), "sha256": artifacts.sha256_file(path)}
        inputs, stem = [path], path.stem
    out_vmfb = lower.output_path(opts.output, stem, inputs)
    if inputs:
        model = export.load_pt2(inputs[0])  # bad files fail here, before any progress output
    phases = Phases(quiet=opts.quiet)
    plan = pipeline.build(target)
    with phases.phase("export"):
        entry = lower.export_main(model, plan, example_args, example_kwargs, dynamic_shapes)
    lowered = lower.lower_module([entry], target, dump_ir=opts.dump_ir, phases=phases, plan=plan)
    # A module without a tokenizer: a NAME.tokenizer.* left by an earlier compile of a checkpoint goes.
    return lower.write_artifact(lowered, out_vmfb, source=source, phases=phases, repro_dir=opts.repro_dir,
                                extra_files=llm.tokenizer_files(None))


def _patterns(p) -> tuple[str, ...]:
    """One fnmatch pattern or several."""
    return (p,) if isinstance(p, str) else tuple(p)
