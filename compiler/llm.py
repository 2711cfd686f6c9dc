"""Compile a Llama (a checkpoint, or an llmc Llama module) into one module with prefill and decode.

    prefill(tokens[1, S], k0, v0, ..., k{L-1}, v{L-1}) -> (logits[1, 1, vocab], k0', v0', ...)
    decode(token[1, 1], attention_mask[1, N], k0, v0, ...) -> (logits[1, 1, vocab], k0', v0', ...)

S and N are dynamic, up to --max-seq-len; each cache tensor is [1, n_kv_heads, max_seq_len,
head_dim] in the compute dtype. Both functions are exported from the same (converted) model, so
the weights are one set of parameters in the .irpa. Every returned cache is tied to its input
(`iree.abi.tied`): IREE updates the caller's buffer in place and the runtime keeps the cache on the
device between calls (research/kv-cache.md, variant c_tied: zero full-cache copies per step).

The manifest gets an `llm` section: the model config, max_seq_len, the cache layout and which
entry point plays which role, so `llmc.load(...).generate(...)` and `llmc run` need nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from llmc.compiler import api, artifacts, export, targets
from llmc.compiler.progress import Phases
from llmc.errors import ExportError, UsageError
from llmc.models.llama.config import LlamaConfig
from llmc.models.llama.model import Llama, LlamaDecode, LlamaPrefill, new_cache

DEFAULT_MAX_SEQ_LEN = 4096


def is_llama_checkpoint(path) -> bool:
    from llmc.models.llama import loaders

    return loaders.detect_format(Path(path)) is not None


def load_llama(path) -> Llama:
    """A Llama built around a checkpoint's tensors (memory-mapped where the format allows).

    Its rope tables have the default length; export_llm sizes them to the compiled max-seq-len.
    """
    from llmc.models.llama import loaders

    config, state_dict = loaders.load_checkpoint(Path(path))
    return Llama.from_state_dict(config, state_dict)


def default_name(path: Path) -> str:
    """Output stem for a checkpoint: its folder's name for a folder or consolidated.NN.pth, else the file stem."""
    path = Path(path).resolve()
    if path.is_dir() or path.name.startswith("consolidated."):
        path = path if path.is_dir() else path.parent
        return path.name or "llama"
    return path.name.split(".")[0] or "llama"


def _default_len(config: LlamaConfig) -> int:
    return min(config.max_seq_len, DEFAULT_MAX_SEQ_LEN)


def export_llm(llama: Llama, dtype: str, max_seq_len: int, attention: str):
    """Export prefill and decode over one converted copy of the model; returns [(Exported, name)]."""
    from torch.export import Dim

    tdt = export.TORCH_DTYPES[dtype]
    # A copy (sharing weight storage when the dtype already matches): the caller's module is untouched.
    llama = export.convert_module(llama, tdt).eval()
    llama.set_rope_positions(max_seq_len)  # f32 tables sized to the cache; they become parameters
    config = llama.config
    cache = new_cache(config, max_seq_len, tdt)
    n_cache = len(cache)
    example_len = min(8, max_seq_len)

    seq = Dim("seq", min=2, max=max_seq_len)
    kv_len = Dim("kv_len", min=1, max=max_seq_len)
    programs = []
    with torch.no_grad():
        for name, wrapper, args, dyn in (
            (
                "prefill",
                LlamaPrefill(llama),
                (torch.zeros(1, example_len, dtype=torch.int64), *cache),
                ({1: seq}, (None,) * n_cache),
            ),
            (
                "decode",
                LlamaDecode(llama),
                (torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, example_len, dtype=torch.int64), *cache),
                (None, {1: kv_len}, (None,) * n_cache),
            ),
        ):
            try:
                ep = torch.export.export(wrapper, args, dynamic_shapes=dyn, strict=False)
            except Exception as e:
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ExportError(f"torch.export of {name} failed: {type(e).__name__}: {msg}") from e
            programs.append((export.Exported(export.decompose(ep, attention), strip_prefix="llama."), name))
    return programs


def compile_llm(
    model,
    *,
    target: str = "cpu",
    dtype: str = "f32",
    arch: str | None = None,
    output=None,
    max_seq_len: int | None = None,
    dump_ir=None,
    repro_dir=None,
    extra_iree_flags: tuple[str, ...] = (),
    quiet: bool = True,
):
    """Compile a Llama checkpoint (Meta .pth + params.json, or an HF folder) or an llmc `Llama`."""
    probe = targets.resolve(target, arch, dtype)
    if output is None and isinstance(model, (str, os.PathLike)):
        output = Path.cwd() / f"{default_name(Path(model))}.vmfb"
    out_vmfb, _ = api._output_paths(output, model)
    if max_seq_len is not None and max_seq_len < 3:
        raise UsageError(f"--max-seq-len={max_seq_len}: must be at least 3 (prefill takes 2 tokens or more)")
    phases = Phases(quiet=quiet)
    if isinstance(model, (str, os.PathLike)):
        if not Path(model).exists():
            raise UsageError(f"{model}: no such file or directory")
        source = {"kind": "llama-checkpoint", "path": str(Path(model).resolve())}
        with phases.phase("load checkpoint"):
            llama = load_llama(model)
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

    with phases.phase("export"):
        programs = export_llm(llama, dtype, max_seq_len, probe.caps.attention)
    resolved = api.with_extra_flags(targets.resolve(target, arch, dtype, dynamic=True), extra_iree_flags)
    entries = []
    for exported, name in programs:
        sig = artifacts.entry_signature(exported.program, name)
        sig["outputs"]["children"][0]["role"] = "logits"
        entries.append((exported, name, sig))
    n_cache = 2 * config.n_layers
    tied = {
        "prefill": {1 + i: 1 + i for i in range(n_cache)},
        "decode": {1 + i: 2 + i for i in range(n_cache)},
    }
    cache_dtype = str(export.TORCH_DTYPES[dtype]).removeprefix("torch.")
    llm = {
        "family": "llama",
        "config": config.as_dict(),
        "max_seq_len": max_seq_len,
        "cache": {
            "layout": "per-layer K and V: [k0, v0, k1, v1, ...]",
            "count": n_cache,
            "shape": [1, config.n_kv_heads, max_seq_len, config.head_dim],
            "dtype": cache_dtype,
            "tied": True,
        },
        "prefill": {"function": "prefill", "min_tokens": 2, "cache_args_start": 1},
        "decode": {"function": "decode", "cache_args_start": 2},
    }
    return api.build_artifact(
        entries,
        resolved=resolved,
        source=source,
        out_vmfb=out_vmfb,
        phases=phases,
        dump_ir=dump_ir,
        repro_dir=repro_dir,
        tied_results=tied,
        extra_manifest={"llm": llm, "default_entry": "prefill"},
    )
