"""Compile a Llama (a checkpoint, or an llmc Llama module) into one module with prefill and decode.

    prefill(tokens[1, S], k0, v0, ..., k{L-1}, v{L-1}) -> (logits[1, 1, vocab], k0', v0', ...)
    decode(token[1, 1], attention_mask[1, N], k0, v0, ...) -> (logits[1, 1, vocab], k0', v0', ...)

S and N are dynamic, up to --max-seq-len; each cache tensor is [1, n_kv_heads, max_seq_len,
head_dim] in the compute dtype. Prefill buckets (--prefill-buckets; by default on hip and cuda) add

    prefill_B(tokens[1, B], length[1], k0, v0, ...) -> (logits of position length - 1, k0', v0', ...)

for fixed sizes B: the prompt padded at the end to B, every matmul with a static M. generate()
takes the smallest bucket that holds the prompt (and that it fills enough: `min_fill`), else the
dynamic prefill. Measured on an H200 (docs/targets.md): a 128-token prefill 12.6x faster on a
1B Llama, 3.3x on the 125M one; on a 2-core EPYC 1.24x (1 thread) and 1.34x (2 threads). A prefill
chunk (--prefill-chunk; by default 64 on cpu when the cache holds two) adds

    prefill_chunk(tokens[1, C], attention_mask[1, L], k0, v0, ...) -> (logits of position L - 1, k0', v0', ...)

C new tokens after L - C cached ones, C fixed: generate() runs a long prompt's first P mod C tokens
through the dynamic prefill and the rest C at a time, static-M matmuls without padding.

All functions are exported from the same (converted) model, so the weights are one set of
parameters in the .irpa. Every returned cache is tied to its input
(`iree.abi.tied`): IREE updates the caller's buffer in place and the runtime keeps the cache on the
device between calls (docs/architecture.md: zero full-cache copies per step).

The manifest gets an `llm` section: the model config, max_seq_len, the cache layout and which
entry point plays which role, so `llmc.load(...).generate(...)` and `llmc run` need nothing else.
The checkpoint's tokenizer (tokenizer.json, else tokenizer.model, with tokenizer_config.json when
there is one) is copied beside the artifact as NAME.tokenizer.json / NAME.tokenizer.model
(+ NAME.tokenizer_config.json) and recorded as `llm.tokenizer` (null without one); runtime/tokenizer.py
reads it for `llmc run --prompt` and `generate_text`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from llmc import dtypes
from llmc.compiler import artifacts, export, greedy, lower, ukernels
from llmc.compiler.progress import Phases
from llmc.compiler.targets import check_static_decode, parse_buckets, parse_chunk, parse_kv_dtype
from llmc.errors import ExportError, UsageError
from llmc.models.llama.config import LlamaConfig
from llmc.models.llama import tensor_parallel as tensor_parallel_llama
from llmc.models.llama.model import Llama, LlamaDecode, LlamaDecodeStatic, LlamaPrefill, LlamaPrefillBucket, LlamaPrefillChunk, new_cache
from llmc.passes.f32_gemm_weights import FIXED_ROWS_OPTION

DEFAULT_MAX_SEQ_LEN = 4096

# --prefill-buckets auto on hip and cuda: 4x apart, so a prompt pads to at most 4x its length; each
# bucket is one more function to compile. On cpu auto means none: a padded prompt costs its pads,
# and static M gained only 1.24-1.34x there. On vulkan/xpu none: SPIR-V f16 builds fail (resolve_buckets).
GPU_PREFILL_BUCKETS = (128, 512, 2048)
# The least share of a bucket a prompt must fill to use it (else the dynamic prefill runs). On a GPU
# any bucket beats the dynamic prefill (a 128-token static prefill ran 3.3-12.6x faster there, and
# small prompts do not fill the GPU anyway); on cpu compute grows with the pads.
MIN_FILL = {"gpu": 0.0, "cpu": 0.8}


def _aggressive_fusion(target) -> bool:
    """Whether the target's IREE flags turn on aggressive fusion (the flag's last value wins; LLVM reads a
    bare flag as true and takes true/True/TRUE/1), under which IREE 3.13 fails on a static-length prefill."""
    fusion = [f.partition("=")[2] or "true" for f in target.iree_flags if f.startswith("--iree-dispatch-creation-enable-aggressive-fusion")]
    return bool(fusion) and fusion[-1].lower() in ("true", "1")


def resolve_buckets(spec, target, max_seq_len: int, tensor_parallel: int) -> tuple[int, ...]:
    """The bucket sizes to export for `spec` (anything targets.parse_buckets takes) on this target."""
    spec = parse_buckets(spec)
    spirv = target.caps.backend == "vulkan-spirv"
    if spec == "auto":
        if target.name == "cpu" or spirv or tensor_parallel > 1:
            return ()
        return tuple(b for b in GPU_PREFILL_BUCKETS if b <= max_seq_len)
    if spec and spirv and target.compute_dtype == "f16":
        # IREE 3.13, the decomposed attention's softmax at a static length (tiny Llama, bucket 128, llvmpipe):
        # "failed to legalize operation 'memref.alloc' ... memref<64xindex, #spirv.storage_class<Workgroup>>".
        raise UsageError(f"--prefill-buckets: not available on {target.name} with f16 math: IREE 3.13's SPIR-V backend fails "
                         "to compile the static-length attention (failed to legalize 'memref.alloc' in workgroup memory); "
                         "leave it out or use --dtype f32")
    if spec and tensor_parallel > 1:
        raise UsageError("--prefill-buckets: not available with --tensor-parallel yet; leave it out (the split module "
                         "prefills with its dynamic entry point)")
    if spec and target.name == "cpu" and _aggressive_fusion(target):
        # IREE 3.13 with aggressive fusion, tiny Llama, bucket 128, f32 and bf16 alike: the V projection's unpack is stored
        # (the cache rows) and broadcast in one dispatch, and its codegen fails: "'iree_linalg_ext.map_store' op write
        # affecting operations on global resources are restricted to workgroup distributed contexts".
        raise UsageError("--prefill-buckets: not available on cpu with --iree-flag=--iree-dispatch-creation-enable-aggressive-fusion: "
                         "IREE 3.13 fails to compile a static-length prefill with it; drop that flag or the buckets")
    too_long = [b for b in spec if b > max_seq_len]
    if too_long:
        raise UsageError(f"--prefill-buckets: {', '.join(map(str, too_long))} exceed the KV cache (--max-seq-len {max_seq_len}); "
                         "give sizes up to it or raise --max-seq-len")
    return spec


# --prefill-chunk auto: on cpu, the chunk a prompt of at least this many tokens is prefilled in (all
# but its first P mod C tokens), when the cache holds at least two chunks. docs/targets.md: small-125m
# f32 on this project's EPYC, prefill of a 128-token prompt at a static M vs the dynamic one.
CPU_PREFILL_CHUNK = 64


def resolve_chunk(spec, target, max_seq_len: int, tensor_parallel: int) -> int:
    """The prefill chunk's size for --prefill-chunk `spec` (anything targets.parse_chunk takes) on this
    target; 0: none."""
    spec = parse_chunk(spec)
    fused = _aggressive_fusion(target)
    if spec == "auto":
        ok = target.name == "cpu" and tensor_parallel == 1 and not fused and max_seq_len >= 2 * CPU_PREFILL_CHUNK
        if ok and target.dtype in ukernels.KINDS:
            # packed narrow weights: without llmc's many-row kernels every chunk would widen every weight
            # again (a bf16 chunk prefill ran slower than the dynamic one so: docs/targets.md)
            ok = ukernels.unavailable(target) is None
        return CPU_PREFILL_CHUNK if ok else 0
    if not spec:
        return 0
    if target.name != "cpu":
        raise UsageError(f"--prefill-chunk: cpu only for now ({target.name} prefills through --prefill-buckets, whose static "
                         "shapes GPUs need); leave it out")
    if tensor_parallel > 1:
        raise UsageError("--prefill-chunk: not available with --tensor-parallel yet; leave it out")
    if fused:
        # the same IREE 3.13 failure as a bucket's (resolve_buckets): a static-length prefill with aggressive fusion
        raise UsageError("--prefill-chunk: not available on cpu with --iree-flag=--iree-dispatch-creation-enable-aggressive-fusion: "
                         "IREE 3.13 fails to compile a static-length prefill with it; drop that flag or the chunk")
    if spec >= max_seq_len:
        raise UsageError(f"--prefill-chunk={spec}: must be less than the KV cache (--max-seq-len {max_seq_len}); "
                         "give a smaller chunk or raise --max-seq-len")
    return spec


def resolve_kv_dtype(spec, target, tensor_parallel: int) -> str:
    """The KV cache's dtype (a --dtype name: f32, bf16, f16) for --kv-dtype `spec` on this target. auto:
    bf16 for --dtype bf16 on cpu (bf16 weights under f32 math: the cache in the dtype the user asked
    for, as eager bf16 keeps it; half the memory, and half the bytes a decode step's attention reads),
    else the compute dtype. A cache narrower than the compute dtype (bf16 under f32 math) only on cpu,
    where the decode attention kernel reads it (passes/decode_attention_kernel.py) and the tests cover
    it, and not with --tensor-parallel."""
    spec = parse_kv_dtype(spec)
    if spec == "auto":
        narrow = target.name == "cpu" and target.dtype == "bf16" and target.compute_dtype == "f32" and tensor_parallel == 1
        return "bf16" if narrow else target.compute_dtype
    if spec == target.compute_dtype:
        return spec
    if target.name != "cpu":
        raise UsageError(f"--kv-dtype {spec}: a cache in another dtype than the compute dtype ({target.compute_dtype} on "
                         f"{target.name}) is cpu only for now; leave it out")
    if tensor_parallel > 1:
        raise UsageError(f"--kv-dtype {spec}: not available with --tensor-parallel yet; leave it out")
    if spec != "bf16" or target.compute_dtype != "f32":
        raise UsageError(f"--kv-dtype {spec}: cpu stores a {target.compute_dtype} model's cache as {target.compute_dtype} or, under "
                         "f32 math, bf16; give auto or bf16")
    return spec


def resolve_static_decode(spec, tensor_parallel: int) -> bool:
    """Whether to export decode_static for --static-decode `spec` ("auto", "on", "off"). auto: off on
    every target (H200: 1.2-1.4x faster steps for a 125M model, none for a 1B, and the step reads all
    max_seq_len cache rows; docs/targets.md)."""
    if check_static_decode(spec) == "on" and tensor_parallel > 1:
        raise UsageError("--static-decode on: not available with --tensor-parallel yet; leave it out")
    return spec == "on"


def is_llama_checkpoint(path) -> bool:
    from llmc.models.llama import loaders

    return loaders.detect_format(Path(path)) is not None


def is_llm_source(model, example_args=(), example_kwargs=None, config=None) -> bool:
    """A Llama checkpoint path (or a bare weights file given with a config), or an llmc Llama given
    without example inputs: the prefill + decode route."""
    if isinstance(model, (str, os.PathLike)):
        p = Path(model)
        if config is not None and p.is_file() and p.suffix != ".pt2":
            return True
        return p.suffix != ".pt2" and p.exists() and is_llama_checkpoint(p)
    return isinstance(model, Llama) and not example_args and not example_kwargs


def checkpoint_files(path: Path) -> list[Path]:
    """The files a compile of this checkpoint reads (and so must never write): the path itself and
    every file in its folder (config, weights, tokenizer, params.json)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return [path, *(f for f in folder.iterdir() if f.is_file())] if folder.is_dir() else [path]


# Where a checkpoint keeps its tokenizer, in order of preference, and the suffix each copy gets after
# NAME. tokenizer_config.json (chat template, BOS/EOS strings) is copied along with either.
TOKENIZER_FILES = {"tokenizer.json": ".tokenizer.json", "tokenizer.model": ".tokenizer.model"}
TOKENIZER_CONFIG = ("tokenizer_config.json", ".tokenizer_config.json")


@dataclasses.dataclass(frozen=True)
class CheckpointTokenizer:
    path: Path
    kind: str  # runtime/tokenizer.py's KINDS
    config: Path | None  # tokenizer_config.json


def find_tokenizer(path) -> CheckpointTokenizer | None:
    """The tokenizer files in a checkpoint's folder: HF tokenizer.json, or tokenizer.model (Llama-3 tiktoken
    BPE ranks or a Llama-2 SentencePiece model, told apart by content). None when there is neither."""
    from llmc.runtime.tokenizer import detect_kind

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            kind = detect_kind(f)
            if kind is None or (name == "tokenizer.json") != (kind == "hf"):
                raise UsageError(
                    f"{f}: not a tokenizer llmc can read (tokenizer.json for the `tokenizers` library, or a tokenizer.model "
                    "of tiktoken BPE ranks or SentencePiece); replace it with the checkpoint's own, or move it out of "
                    "the folder to compile without a tokenizer"
                )
            config = folder / TOKENIZER_CONFIG[0]
            if config.is_file():
                try:
                    ok = isinstance(json.loads(config.read_text()), dict)
                except (OSError, ValueError):
                    ok = False
                if not ok:
                    raise UsageError(f"{config}: not a JSON object; replace it with the checkpoint's own tokenizer_config.json or remove it")
            return CheckpointTokenizer(f, kind, config if config.is_file() else None)
    return None


def tokenizer_files(tok: CheckpointTokenizer | None) -> list[tuple[Path | None, str]]:
    """write_artifact's extra_files: the tokenizer's copies, and None for every tokenizer name this
    compile does not ship, so a stale one from an earlier compile of the same NAME is removed."""
    given = {TOKENIZER_FILES[tok.path.name]: tok.path, TOKENIZER_CONFIG[1]: tok.config} if tok else {}
    return [(given.get(suffix), suffix) for suffix in (*TOKENIZER_FILES.values(), TOKENIZER_CONFIG[1])]


def tokenizer_manifest(tok: CheckpointTokenizer | None, name: str) -> dict | None:
    """The manifest's `llm.tokenizer`: the copied file's name beside the .vmfb, its kind and sha256."""
    if tok is None:
        return None
    return {
        "file": name + TOKENIZER_FILES[tok.path.name],
        "kind": tok.kind,
        "sha256": artifacts.sha256_file(tok.path),
        "config": name + TOKENIZER_CONFIG[1] if tok.config else None,
    }


def load_llama(path, config=None) -> Llama:
    """A Llama built around a checkpoint's tensors (memory-mapped where the format allows).

    config: for a bare weights file, its config (a name, a params.json/config.json path; loaders.py).
    Its rope tables have the default length; export_llm sizes them to the compiled max-seq-len.
    """
    from llmc.models.llama import loaders

    config, state_dict = loaders.load_checkpoint(Path(path), config=config)
    return Llama.from_state_dict(config, state_dict)


def default_name(path: Path) -> str:
    """Output stem for a checkpoint: its folder's name for a folder or consolidated.NN.pth, else the file stem."""
    path = Path(path).resolve()
    if path.is_dir() or path.name.startswith("consolidated.") or path.name in ("params.json", "config.json"):
        path = path if path.is_dir() else path.parent
        return path.name or "llama"
    return path.name.split(".")[0] or "llama"


def _default_len(config: LlamaConfig) -> int:
    return min(config.max_seq_len, DEFAULT_MAX_SEQ_LEN)


def export_llm(llama: Llama, dtype: str, max_seq_len: int, keep_narrow_linears: bool | tuple = False,
               tensor_parallel: int = 1, prefill_buckets: tuple[int, ...] = (), static_decode: bool = False,
               prefill_chunk: int = 0, kv_dtype: str | None = None) -> list[lower.Entry]:
    """Export prefill and decode over one converted copy of the model, as the module's entry points.
    keep_narrow_linears: see export.convert_module (fp8/int8 quantized from the checkpoint's own dtype, bf16
    weights under f32 math stored as they are). tensor_parallel: N > 1 exports the model split over N
    devices (models/llama/tensor_parallel.py), each cache shard an argument on its device. prefill_buckets:
    one more entry point per size, `prefill_<size>`, with the prompt length fixed (LlamaPrefillBucket).
    static_decode: one more entry point, `decode_static`, a decode step with every shape fixed (LlamaDecodeStatic).
    prefill_chunk: C > 0 adds `prefill_chunk`, C tokens after the cached ones (LlamaPrefillChunk), C fixed and
    the cached length dynamic. kv_dtype: the cache's dtype (a --dtype name; None: `dtype`), K/V rounded to it
    as they are written and widened back as attention reads them (models/llama/model.py `stored`, `read`)."""
    from torch.export import Dim

    tdt = dtypes.compute_torch_dtype(dtype)
    kv_tdt = dtypes.compute_torch_dtype(kv_dtype or dtype)
    # A copy (sharing weight storage when the dtype already matches): the caller's module is untouched.
    llama = export.convert_module(llama, tdt, keep_narrow_linears=keep_narrow_linears).eval()
    llama.set_rope_positions(max_seq_len)  # f32 tables sized to the cache; they become parameters
    config = llama.config
    n = tensor_parallel
    if n > 1:
        tp = tensor_parallel_llama.TensorParallelLlama(llama, n)
        cache = tensor_parallel_llama.new_cache(config, n, max_seq_len, kv_tdt)
        wrappers = {"prefill": tensor_parallel_llama.TensorParallelPrefill(tp), "decode": tensor_parallel_llama.TensorParallelDecode(tp)}
        strip = "tp."
        cache_device = [d for _, d, _ in tensor_parallel_llama.cache_order(config.n_layers, n)]
    else:
        cache = new_cache(config, max_seq_len, kv_tdt)
        wrappers = {"prefill": LlamaPrefill(llama), "decode": LlamaDecode(llama)}
        strip = "llama."
        cache_device = [0] * len(cache)
    n_cache = len(cache)
    example_len = min(8, max_seq_len)

    seq = Dim("seq", min=2, max=max_seq_len)
    kv_len = Dim("kv_len", min=1, max=max_seq_len)
    tied = {"prefill": {1 + i: 1 + i for i in range(n_cache)}, "decode": {1 + i: 2 + i for i in range(n_cache)}}
    entries = []
    with torch.no_grad():
        for name, wrapper, args, dyn in (
            (
                "prefill",
                wrappers["prefill"],
                (torch.zeros(1, example_len, dtype=torch.int64), *cache),
                ({1: seq}, (None,) * n_cache),
            ),
            (
                "decode",
                wrappers["decode"],
                (torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, example_len, dtype=torch.int64), *cache),
                (None, {1: kv_len}, (None,) * n_cache),
            ),
        ):
            ep = _export(name, wrapper, args, dyn)
            first = 1 if name == "prefill" else 2  # the first cache argument
            devices = {first + i: d for i, d in enumerate(cache_device) if d} if n > 1 else None
            entries.append(lower.Entry(export.Exported(ep, strip_prefix=strip), name, tied=tied[name], logits_output=0,
                                       arg_devices=devices, result_devices={1 + i: d for i, d in enumerate(cache_device) if d} if n > 1 else None))
        for size in prefill_buckets:
            name = f"prefill_{size}"
            args = (torch.zeros(1, size, dtype=torch.int64), torch.tensor([size], dtype=torch.int64), *cache)
            ep = _export(name, LlamaPrefillBucket(llama), args, None)
            entries.append(lower.Entry(export.Exported(ep, strip_prefix=strip), name, tied=tied["decode"], logits_output=0))
        if prefill_chunk:
            c = prefill_chunk
            # the mask's length is the cached positions + C; an example below max_seq_len (see LlamaDecode's slice_copy)
            args = (torch.zeros(1, c, dtype=torch.int64), torch.ones(1, min(c + 1, max_seq_len), dtype=torch.int64), *cache)
            dyn = (None, {1: Dim("chunk_end", min=c, max=max_seq_len)}, (None,) * n_cache)
            ep = _export("prefill_chunk", LlamaPrefillChunk(llama), args, dyn)
            # tokens, attention mask, then the cache: decode's argument layout, so decode's ties
            entries.append(lower.Entry(export.Exported(ep, strip_prefix=strip), "prefill_chunk", tied=tied["decode"], logits_output=0))
        if static_decode:
            args = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), *cache)
            ep = _export("decode_static", LlamaDecodeStatic(llama), args, None)
            # token, position, then the cache: the same argument layout as decode, so the same ties
            entries.append(lower.Entry(export.Exported(ep, strip_prefix=strip), "decode_static", tied=tied["decode"], logits_output=0))
    return entries


DECODE_FUNCTIONS = ("decode", "decode_static")  # the entry points generate() runs for a decode step


def greedy_decode(target, tensor_parallel: int) -> bool:
    """Whether the decode entry points get a `_greedy` twin (compiler/greedy.py): on llvm-cpu, one
    device. There a greedy step's logits row cost more host time than the choice in the module
    (docs/targets.md "The greedy token in the module"); on GPU targets that has not been measured,
    and a split module's logits are gathered from several devices."""
    return target.caps.backend == "llvm-cpu" and tensor_parallel == 1


def _export(name: str, wrapper, args: tuple, dynamic_shapes):
    """torch.export of one entry point; a failure is an ExportError naming the entry point."""
    try:
        return torch.export.export(wrapper, args, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"torch.export of {name} failed: {type(e).__name__}: {msg}") from e


def _kept_narrow(target) -> bool | tuple:
    """Which checkpoint weights stay narrower than the compute dtype through export: fp8 and int8
    quantize from any (bf16, f16); cpu bf16 stores bf16 ones as their bits (an f16 weight is converted, so it is
    rounded to bf16 like the rest). SPIR-V bf16 converts everything: its bf16 pass widens bf16 weights
    without the packed rewrite, and a kept bf16 linear left bf16 metadata behind its transposes
    ("'tensor.cast' op operand type 'tensor<64x64xf32>' and result type 'tensor<64x64xbf16>' are cast
    incompatible")."""
    if target.dtype in lower.QUANTIZED_DTYPES:
        return True
    if target.dtype == "bf16" and target.compute_dtype == "f32" and target.caps.backend == "llvm-cpu":
        return (torch.bfloat16,)
    return False


def compile_llm(model, opts: lower.CompileOptions):
    """Compile a Llama checkpoint (Meta .pth + params.json, or an HF folder) or an llmc `Llama`."""
    target = opts.resolve()
    inputs, stem = [], "llama"
    if isinstance(model, (str, os.PathLike)):
        inputs, stem = checkpoint_files(Path(model)), default_name(Path(model))
    out_vmfb = lower.output_path(opts.output, stem, inputs)
    max_seq_len = opts.max_seq_len
    if max_seq_len is not None and max_seq_len < 3:
        raise UsageError(f"--max-seq-len={max_seq_len}: must be at least 3 (prefill takes 2 tokens or more)")
    phases = Phases(quiet=opts.quiet)
    tokenizer = None
    if isinstance(model, (str, os.PathLike)):
        tokenizer = find_tokenizer(Path(model))  # checked before the long steps: a bad file fails fast
        source = {"kind": "llama-checkpoint", "path": str(Path(model).resolve())}
        with phases.phase("load checkpoint"):
            llama = load_llama(model, opts.config)
        if Path(model).is_file():
            source["sha256"] = artifacts.sha256_file(Path(model))
    elif isinstance(model, Llama):
        llama, source = model, {"kind": "Llama"}
    else:
        raise UsageError(f"compile_llm: expected a checkpoint path or an llmc Llama, not {type(model).__name__}")
    config = llama.config
    max_seq_len = max_seq_len or _default_len(config)
    if max_seq_len > config.max_seq_len:
        raise UsageError(
            f"--max-seq-len={max_seq_len}: {config.name} was trained for {config.max_seq_len} positions; use at most that"
        )

    n = target.devices
    if n > 1:
        try:
            tensor_parallel_llama.check_split(config, n)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if opts.quant_exclude or opts.fp8_exclude:
            # a device's weights are named shards.<d>.<the checkpoint's name>: the user's patterns match
            # the checkpoint's names there too
            pats = (*opts.quant_exclude, *opts.fp8_exclude)
            target = dataclasses.replace(target, pass_options=tuple(
                (k, tuple(v) + tuple(f"{tensor_parallel_llama.SHARD_PREFIX}*.{p}" for p in pats)) if k in ("fp8_exclude", "quant_exclude") else (k, v)
                for k, v in target.pass_options))
    buckets = resolve_buckets(opts.prefill_buckets, target, max_seq_len, n)
    static = resolve_static_decode(opts.static_decode, n)
    chunk = resolve_chunk(opts.prefill_chunk, target, max_seq_len, n)
    kv_dtype = resolve_kv_dtype(opts.kv_dtype, target, n)
    if buckets or chunk:  # entry points with a fixed row count: passes/f32_gemm_weights.py stores f32 weights for their kernel
        target = dataclasses.replace(target, pass_options=(*target.pass_options, (FIXED_ROWS_OPTION, True)))
    with phases.phase("export"):
        entries = export_llm(llama, target.compute_dtype, max_seq_len, keep_narrow_linears=_kept_narrow(target), tensor_parallel=n,
                             prefill_buckets=buckets, static_decode=static, prefill_chunk=chunk, kv_dtype=kv_dtype)
    if greedy_decode(target, n):
        entries = [dataclasses.replace(e, greedy=True) if e.function in DECODE_FUNCTIONS else e for e in entries]
    lowered = lower.lower_module(entries, target, dump_ir=opts.dump_ir, phases=phases,
                                 param_device=tensor_parallel_llama.device_of_param if n > 1 else None)
    llm = llm_manifest(config, target.compute_dtype, max_seq_len, tokenizer_manifest(tokenizer, out_vmfb.stem), tensor_parallel=n,
                       prefill_buckets=buckets, min_fill=MIN_FILL["cpu" if target.name == "cpu" else "gpu"], static_decode=static,
                       prefill_chunk=chunk, kv_dtype=kv_dtype)
    for key in DECODE_FUNCTIONS:  # each twin lower_module emitted: its name and result indices, from its signature
        if key in llm and greedy.greedy_name(llm[key]["function"]) in lowered.signatures:
            llm[key]["greedy"] = greedy.record(lowered.signatures, llm[key]["function"])
    if n > 1:
        llm["tensor_parallel"]["param_bytes_by_device"] = param_bytes_by_device(lowered.store, n)
    return lower.write_artifact(
        lowered, out_vmfb, source=source, phases=phases, repro_dir=opts.repro_dir,
        extra_manifest={"llm": llm, "default_entry": "prefill"}, extra_files=tokenizer_files(tokenizer),
    )


def param_bytes_by_device(store, n: int) -> list[int]:
    """Bytes of the parameters pinned to each device (a split module's names: shards.<d>.), then
    the unsplit ones (the rope tables, lifted constants: device 0 holds them too) as the last entry."""
    out = [0] * (n + 1)
    for name, t in store.tensors.items():
        d = tensor_parallel_llama.device_of_param(name) if name.startswith(tensor_parallel_llama.SHARD_PREFIX) else n
        out[d] += t.numel() * t.element_size()
    return out


def llm_manifest(config: LlamaConfig, dtype: str, max_seq_len: int, tokenizer: dict | None = None, tensor_parallel: int = 1,
                 prefill_buckets: tuple[int, ...] = (), min_fill: float = 0.0, static_decode: bool = False,
                 prefill_chunk: int = 0, kv_dtype: str | None = None) -> dict:
    """The manifest's `llm` section: what generate() and `llmc run` need besides the entry points.
    tokenizer: tokenizer_manifest's record, or None when the checkpoint had none. tensor_parallel: N > 1
    describes the split module: N cache shards a layer (cache_order), each on its device.
    prefill_buckets: the sizes of the prefill_<size> entry points; min_fill: the least share of one a
    prompt must fill for generate() to pad it to that bucket. static_decode: the module has decode_static
    (LlamaDecodeStatic), which generate() then runs for every decode step. prefill_chunk: C > 0, the module has
    prefill_chunk (LlamaPrefillChunk), which generate() runs for all but the first P mod C tokens of a prompt
    of P >= C tokens that no bucket takes. kv_dtype: the cache's dtype (a --dtype name; None: `dtype`).
    (compile_llm adds each decode record's `greedy` entry where the module has the twin: greedy.record.)"""
    n = tensor_parallel
    n_cache = 2 * config.n_layers * n
    if n > 1:
        tp = {
            "devices": n,
            "split": "Megatron: attention heads, KV heads and MLP channels split; o_proj and down_proj all-reduced; "
                     "embedding and LM head split by vocabulary; norms on every device",
            "heads_per_device": config.n_heads // n,
            "kv_heads_per_device": config.n_kv_heads // n,
            "ffn_per_device": config.ffn_dim // n,
            "vocab_per_device": -(-config.vocab_size // n),
            "cache_devices": [d for _, d, _ in tensor_parallel_llama.cache_order(config.n_layers, n)],
        }
        layout = "per layer, per device: [k(l0,d0), v(l0,d0), k(l0,d1), v(l0,d1), ..., k(l1,d0), ...]"
    else:
        tp, layout = None, "per-layer K and V: [k0, v0, k1, v1, ...]"
    out = {
        "family": "llama",
        "config": config.as_dict(),
        "max_seq_len": max_seq_len,
        "cache": {
            "layout": layout,
            "count": n_cache,
            "shape": [1, config.n_kv_heads // n, max_seq_len, config.head_dim],
            "dtype": dtypes.COMPUTE_DTYPES[kv_dtype or dtype],
            "tied": True,
            # K/V rounded to a dtype narrower than the math's (--kv-dtype bf16): llmc diff's eager does the same
            "narrowed": (kv_dtype or dtype) != dtype,
        },
        "prefill": {"function": "prefill", "min_tokens": 2, "cache_args_start": 1},
        "decode": {"function": "decode", "cache_args_start": 2},
        "prefill_buckets": [{"function": f"prefill_{b}", "tokens": b, "length_arg": 1, "cache_args_start": 2}
                            for b in prefill_buckets],
        "prefill_bucket_min_fill": min_fill,
        "tokenizer": tokenizer,
    }
    if prefill_chunk:
        out["prefill_chunk"] = {"function": "prefill_chunk", "tokens": prefill_chunk, "mask_arg": 1, "cache_args_start": 2}
    if static_decode:
        out["decode_static"] = {"function": "decode_static", "position_arg": 1, "cache_args_start": 2}
    if tp is not None:
        out["tensor_parallel"] = tp
    return out
