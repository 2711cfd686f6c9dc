"""Llama checkpoint loaders: Meta (consolidated.NN.pth + params.json) and Hugging Face (config.json +
safetensors or pytorch_model.bin), both returned under Hugging Face LlamaForCausalLM's names.

    config, state = load_checkpoint(path, dtype=None)

`state` maps `model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
`model.layers.{i}.mlp.{gate,up,down}_proj.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
`model.norm.weight` and `lm_head.weight` (absent when `config.tie_embeddings`) to tensors, with the
rotary dimensions of q/k in HF's rotate-half order.

Memory: files are memory-mapped (`torch.load(weights_only=True, mmap=True)`, `safetensors.safe_open`) and their tensors
are passed through untouched, so the weights are never held twice. New tensors are made only for what
is converted: Meta's wq/wk (row permutation), a `dtype` change, and tensors merged from several Meta
model-parallel shards.

Meta's rotary layout: Meta's reference code treats rows (2i, 2i+1) of each head as one complex number
rotated by frequency i ("interleaved pairs"); HF's rotate-half pairs row i with row i + head_dim/2.
So HF row c*head_dim/2 + i of a head is Meta row 2i + c (c in {0, 1}): `meta_to_hf_rotary`.

Validation happens before anything is converted: every missing, unexpected or mis-shaped tensor is
reported in one `InputError` naming the file and the config it was checked against.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import zipfile
from pathlib import Path

import torch

from llmc.errors import InputError
from llmc.models.llama.config import LlamaConfig

log = logging.getLogger(__name__)

__all__ = [
    "load_checkpoint",
    "detect_format",
    "llama_param_shapes",
    "hf_to_meta_name",
    "meta_to_hf_name",
    "meta_to_hf_rotary",
    "hf_to_meta_rotary",
    "hf_state_dict_to_meta",
    "DTYPES",
]

# User spellings of dtypes (the CLI's short names plus torch's own).
DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "float32": torch.float32, "fp32": torch.float32,
    "f16": torch.float16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}

# Tensors some checkpoints carry that are not parameters (derived from the config): ignored.
_META_IGNORED = re.compile(r"^rope\.freqs$")
_HF_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")

_LIST_LIMIT = 8  # names shown per category in an error message


# ---- names and shapes ----------------------------------------------------------------------------

def llama_param_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of LlamaForCausalLM under its HF name, in HF's state-dict order, with its shape."""
    d, hd, kv = config.dim, config.head_dim, config.n_kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d)}
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (config.n_heads * hd, d)
        shapes[p + "self_attn.k_proj.weight"] = (kv * hd, d)
        shapes[p + "self_attn.v_proj.weight"] = (kv * hd, d)
        shapes[p + "self_attn.o_proj.weight"] = (d, config.n_heads * hd)
        shapes[p + "mlp.gate_proj.weight"] = (config.ffn_dim, d)
        shapes[p + "mlp.up_proj.weight"] = (config.ffn_dim, d)
        shapes[p + "mlp.down_proj.weight"] = (d, config.ffn_dim)
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
    shapes["model.norm.weight"] = (d,)
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes


_LAYER_NAMES = [  # (HF suffix, Meta suffix) inside layer i
    ("self_attn.q_proj.weight", "attention.wq.weight"),
    ("self_attn.k_proj.weight", "attention.wk.weight"),
    ("self_attn.v_proj.weight", "attention.wv.weight"),
    ("self_attn.o_proj.weight", "attention.wo.weight"),
    ("mlp.gate_proj.weight", "feed_forward.w1.weight"),
    ("mlp.down_proj.weight", "feed_forward.w2.weight"),
    ("mlp.up_proj.weight", "feed_forward.w3.weight"),
    ("input_layernorm.weight", "attention_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
]
_TOP_NAMES = [
    ("model.embed_tokens.weight", "tok_embeddings.weight"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "output.weight"),
]
_HF_TO_META_LAYER = dict(_LAYER_NAMES)
_META_TO_HF_LAYER = {m: h for h, m in _LAYER_NAMES}
_HF_TO_META_TOP = dict(_TOP_NAMES)
_META_TO_HF_TOP = {m: h for h, m in _TOP_NAMES}


def hf_to_meta_name(name: str) -> str | None:
    """`model.layers.3.mlp.gate_proj.weight` -> `layers.3.feed_forward.w1.weight`; None if not a Llama parameter."""
    if name in _HF_TO_META_TOP:
        return _HF_TO_META_TOP[name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    if m and m.group(2) in _HF_TO_META_LAYER:
        return f"layers.{m.group(1)}.{_HF_TO_META_LAYER[m.group(2)]}"
    return None


def meta_to_hf_name(name: str) -> str | None:
    """`layers.3.feed_forward.w1.weight` -> `model.layers.3.mlp.gate_proj.weight`; None if not a Llama parameter."""
    if name in _META_TO_HF_TOP:
        return _META_TO_HF_TOP[name]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m and m.group(2) in _META_TO_HF_LAYER:
        return f"model.layers.{m.group(1)}.{_META_TO_HF_LAYER[m.group(2)]}"
    return None


# ---- rotary layout -------------------------------------------------------------------------------

def meta_to_hf_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a q or k projection from Meta's interleaved-pairs rotary layout to HF's
    rotate-half layout: within each head, HF row c*head_dim/2 + i = Meta row 2i + c. Returns a new tensor."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def hf_to_meta_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `meta_to_hf_rotary`. Returns a new tensor."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def hf_state_dict_to_meta(state: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """HF names and rotate-half q/k -> Meta names and interleaved q/k (what consolidated.00.pth holds)."""
    out = {}
    for name, t in state.items():
        meta = hf_to_meta_name(name)
        if meta is None:
            raise InputError(f"{name!r} is not a Llama parameter name")
        out[meta] = _to_meta_layout(name, t, config)
    return out


def _to_meta_layout(hf_name: str, t: torch.Tensor, config: LlamaConfig) -> torch.Tensor:
    if hf_name.endswith("self_attn.q_proj.weight"):
        return hf_to_meta_rotary(t, config.n_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return hf_to_meta_rotary(t, config.n_kv_heads)
    return t


# ---- format detection ----------------------------------------------------------------------------

_HF_WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")
_META_SHARD = re.compile(r"consolidated\.(\d+)\.pth")


def detect_format(path) -> str | None:
    """"meta", "hf" or None: whether `path` looks like a Llama checkpoint llmc can load, and which kind.

    Cheap and never raises: reads at most a config file, a safetensors header or a .pth's pickle
    (memory-mapped, no tensor data). A .pt/.pth that is neither next to a params.json nor holds Meta
    Llama names is not claimed (it may be any torch.save'd object)."""
    try:
        return _detect(Path(path))
    except Exception:  # noqa: BLE001 - detection is a guess; load_checkpoint reports the real problem
        return None


def _detect(p: Path) -> str | None:
    if p.is_dir():
        has_hf_weights = any((p / n).is_file() for n in _HF_WEIGHT_FILES)
        has_meta_weights = any(_META_SHARD.fullmatch(q.name) for q in p.glob("consolidated.*.pth"))
        if has_hf_weights and ((p / "config.json").is_file() or _names_look_hf(_sniff_names(_hf_weights_file(p)))):
            if (p / "config.json").is_file() and not _is_llama_hf_config(p / "config.json"):
                return None
            return "hf"
        if has_meta_weights or (p / "params.json").is_file():
            return "meta"
        if (p / "config.json").is_file() and _is_llama_hf_config(p / "config.json"):
            return "hf"
        return None
    if not p.is_file():
        return None
    name = p.name
    if name == "params.json":
        return "meta"
    if name == "config.json":
        return "hf" if _is_llama_hf_config(p) else None
    if p.suffix in (".pth", ".pt"):
        if (p.parent / "params.json").is_file() or _META_SHARD.fullmatch(name):
            return "meta"
        names = _sniff_names(p)
        if _names_look_meta(names):
            return "meta"
        if _names_look_hf(names) and (p.parent / "config.json").is_file():
            return "hf"
        return None
    if name.endswith((".safetensors", ".safetensors.index.json", ".bin.index.json")) or name == "pytorch_model.bin":
        cfg = p.parent / "config.json"
        if cfg.is_file():
            return "hf" if _is_llama_hf_config(cfg) else None
        return "hf" if _names_look_hf(_sniff_names(p)) else None
    return None


def why_not_checkpoint(p: Path) -> str:
    """What a path lacks to be a Llama checkpoint llmc can load (for the error when detect_format says None)."""
    p = Path(p)
    kinds = ("a Llama checkpoint: a Hugging Face folder (config.json + model.safetensors or pytorch_model.bin) or a "
             "Meta folder (params.json + consolidated.00.pth)")
    if p.is_dir():
        files = {q.name for q in p.iterdir()}
        if not files:
            return f"an empty folder; llmc compiles a .pt2 archive (torch.export.save) or {kinds}"
        has_hf_weights = any(n in files for n in _HF_WEIGHT_FILES)
        if "config.json" in files and not _is_llama_hf_config(p / "config.json"):
            try:
                mtype = json.loads((p / "config.json").read_text()).get("model_type")
            except (OSError, ValueError, AttributeError):
                mtype = None
            return f"config.json describes {'a ' + repr(mtype) if mtype else 'no Llama'} model; llmc's checkpoint loader reads Llama (model_type 'llama')"
        if "config.json" in files:
            return f"has config.json but no weights ({', '.join(_HF_WEIGHT_FILES)})"
        if has_hf_weights:
            return "has Hugging Face weights but no config.json beside them; copy the checkpoint's config.json into the folder"
        return f"has no config.json (Hugging Face) or params.json (Meta); it must be {kinds}"
    if p.suffix in (".pt", ".pth", ".bin"):
        state = _read_torch_file(p)  # raises its own clear error for damaged files and pickled objects
        what = "Meta" if _names_look_meta(set(state)) else "Hugging Face" if _names_look_hf(set(state)) else "non-Llama"
        return (f"a state dict ({len(state)} tensors, {what} names) with no params.json (Meta) or config.json "
                "(Hugging Face) beside it: name its config with --config (a name such as llama3-8b, or a params.json / "
                "config.json path), or put the config file next to it")
    return f"llmc compiles a .pt2 archive (torch.export.save) or {kinds}"


def _hf_weights_file(folder: Path) -> Path:
    return next(folder / n for n in _HF_WEIGHT_FILES if (folder / n).is_file())


def _is_llama_hf_config(path: Path) -> bool:
    try:
        c = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(c, dict) and (c.get("model_type") == "llama" or "LlamaForCausalLM" in (c.get("architectures") or []))


def _sniff_names(path: Path) -> set[str]:
    """Tensor names in a weights file, without reading tensor data."""
    if path.name.endswith(".index.json"):
        return set(json.loads(path.read_text()).get("weight_map", {}))
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return set(f.keys())
    if not zipfile.is_zipfile(path):
        return set()
    obj = torch.load(path, map_location="meta", weights_only=True)
    return set(obj) if isinstance(obj, dict) else set()


def _names_look_meta(names: set[str]) -> bool:
    return "tok_embeddings.weight" in names or "layers.0.attention.wq.weight" in names


def _names_look_hf(names: set[str]) -> bool:
    return "model.embed_tokens.weight" in names or "model.layers.0.self_attn.q_proj.weight" in names


# ---- entry point ---------------------------------------------------------------------------------

def load_checkpoint(path, *, dtype=None, config=None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Load a Meta or Hugging Face Llama checkpoint.

    path: a Meta `.pth` (params.json beside it) or its folder; an HF folder (config.json with
          model.safetensors, model.safetensors.index.json + shards, or pytorch_model.bin[.index.json]),
          or one of those files.
    dtype: None keeps the stored dtypes; a torch.dtype or "f32"/"f16"/"bf16" converts every tensor.
    config: for a single weights file with nothing beside it (a bare state dict, Meta or HF names):
          a named config (`llama3-8b`), a params.json or config.json path, or a LlamaConfig. It wins
          over any config file beside the weights.
    Returns (config, state dict under HF LlamaForCausalLM names, in HF order).
    Raises InputError (exit code 2) for anything wrong with the files, naming the file and the problem.
    """
    p = Path(path)
    want = _parse_dtype(dtype)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory; give a Meta Llama checkpoint (consolidated.00.pth with params.json) "
                         "or a Hugging Face Llama folder (config.json with model.safetensors)")
    if config is not None:
        return _load_with_config(p, want, config)
    if p.is_file() and p.suffix in (".pth", ".pt") and not (p.parent / "params.json").is_file() and (p.parent / "config.json").is_file():
        fmt = "hf"  # an HF state dict saved with torch.save next to its config.json
    elif p.is_file() and p.suffix in (".pth", ".pt"):
        fmt = "meta"  # the user asked for this file: report what is wrong with it rather than "not a checkpoint"
    elif p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json")):
        fmt = "hf"
    else:
        fmt = detect_format(p)
    if fmt == "meta":
        return _load_meta(p, want)
    if fmt == "hf":
        return _load_hf(p, want)
    raise InputError(f"{p}: not a Llama checkpoint llmc can read; expected a Meta checkpoint (consolidated.00.pth with params.json) "
                     "or a Hugging Face LlamaForCausalLM folder (config.json with model.safetensors, "
                     "model.safetensors.index.json or pytorch_model.bin)")


def _parse_dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        if dtype is not None and not dtype.is_floating_point:
            raise InputError(f"dtype={dtype} is not a floating-point dtype; use f32, f16 or bf16")
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise InputError(f"dtype={dtype!r} is not one of {', '.join(sorted(set(DTYPES)))}")


# ---- Meta ----------------------------------------------------------------------------------------

# Meta's model-parallel split dims (fairscale Column/RowParallelLinear); norms are replicated.
# tok_embeddings is split along dim 1 in Llama 2 (ParallelEmbedding) and dim 0 in Llama 3
# (VocabParallelEmbedding): decided from the shapes.
_META_SPLIT_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1}


def _load_meta(p: Path, want: torch.dtype | None, given=None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """given: (config, source, params) from --config, instead of the params.json beside the weights."""
    if p.name == "params.json":
        p = p.parent
    folder = p if p.is_dir() else p.parent
    shards = [p] if given is not None else _meta_shard_files(p)
    params_path = folder / "params.json"
    if given is not None:
        config, params_path, params = given
    elif not params_path.is_file():
        raise InputError(f"{params_path}: not found; a Meta Llama checkpoint ({shards[0].name}) needs the params.json that came "
                         "with it (dim, n_layers, n_heads, n_kv_heads, vocab_size, ...) in the same folder: copy it there, "
                         "or name its config with --config (e.g. --config llama3-8b)")
    else:
        params = _read_json(params_path)
        config = LlamaConfig.from_meta_params(params, source=str(params_path))

    parts = [_read_torch_file(f) for f in shards]
    where = str(shards[0]) if len(shards) == 1 else f"{folder} ({len(shards)} shards {shards[0].name}..{shards[-1].name})"
    raw = parts[0] if len(parts) == 1 else _merge_meta_shards(parts, shards, config, where)
    del parts

    if "output.weight" not in raw and not config.tie_embeddings and "tie_embeddings" not in params:
        # Meta's params.json has no tying flag; a checkpoint without `output` shares the embedding.
        config = config.replace(tie_embeddings=True)
    if config.tie_embeddings and "output.weight" in raw:
        _check_tied_copy(raw, "output.weight", "tok_embeddings.weight", where)
        raw = {k: v for k, v in raw.items() if k != "output.weight"}

    expected = {hf_to_meta_name(n): s for n, s in llama_param_shapes(config).items()}
    _validate(raw, expected, _META_IGNORED, where=where, cfg_source=str(params_path), config=config)
    _check_rope_freqs(raw, config, where, str(params_path))

    state: dict[str, torch.Tensor] = {}
    for hf_name in llama_param_shapes(config):
        t = raw[hf_to_meta_name(hf_name)]
        if want is not None:
            t = t.to(want)
        if hf_name.endswith("self_attn.q_proj.weight"):
            t = meta_to_hf_rotary(t, config.n_heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            t = meta_to_hf_rotary(t, config.n_kv_heads)
        state[hf_name] = t
    return config, state


def resolve_config(spec) -> tuple[LlamaConfig, str, dict | None]:
    """(config, where it came from, Meta params or None) for --config: a name, a params.json or
    config.json path, or a LlamaConfig."""
    from llmc.models.llama.config import get_config

    if isinstance(spec, LlamaConfig):
        return spec, spec.name, None
    spec = str(spec)
    path = Path(spec)
    if path.suffix == ".json":
        if not path.is_file():
            raise InputError(f"--config {spec}: no such file; give a params.json (Meta), a config.json (Hugging Face) or a config name")
        raw = _read_json(path)
        if "hidden_size" in raw or "num_hidden_layers" in raw:
            return LlamaConfig.from_hf_config(raw, source=str(path)), str(path), None
        return LlamaConfig.from_meta_params(raw, source=str(path)), str(path), raw
    try:
        return get_config(spec), f"config {spec}", None
    except InputError as e:
        raise InputError(f"--config {spec}: {e}; or give a params.json / config.json path") from None


def _load_with_config(p: Path, want, spec) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """A single weights file, Meta or HF names, with the config given by the caller."""
    if p.is_dir():
        raise InputError(f"{p}: --config is for a single weights file; a checkpoint folder brings its own params.json or config.json")
    config, source, params = resolve_config(spec)
    names = _sniff_names(p) if (p.suffix == ".safetensors" or zipfile.is_zipfile(p)) else set(_read_torch_file(p))
    if _names_look_meta(names):
        return _load_meta(p, want, given=(config, source, params or {"tie_embeddings": config.tie_embeddings}))
    if _names_look_hf(names):
        return _load_hf(p, want, given=(config, source))
    raise InputError(f"{p}: its tensors have neither Meta (tok_embeddings.weight, layers.0.attention.wq.weight) nor Hugging "
                     "Face (model.embed_tokens.weight, ...) Llama names")


def _meta_shard_files(p: Path) -> list[Path]:
    if p.is_file():
        if _META_SHARD.fullmatch(p.name):
            files = sorted(q for q in p.parent.glob("consolidated.*.pth") if _META_SHARD.fullmatch(q.name))
        else:
            return [p]
    else:
        files = sorted(q for q in p.glob("consolidated.*.pth") if _META_SHARD.fullmatch(q.name))
        if not files:
            others = sorted([*p.glob("*.pth"), *p.glob("*.pt")])
            if len(others) == 1:
                return others
            raise InputError(f"{p}: no consolidated.00.pth here" + (f" (found {', '.join(o.name for o in others)}: pass the one to load)" if others else "")
                             + "; a Meta Llama folder holds consolidated.NN.pth and params.json")
    numbers = [int(_META_SHARD.fullmatch(f.name).group(1)) for f in files]
    if numbers != list(range(len(files))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise InputError(f"{files[0].parent}: Meta model-parallel shards are incomplete: found "
                         f"{', '.join(f.name for f in files)}; missing {', '.join(f'consolidated.{n:02d}.pth' for n in missing)}")
    return files


def _merge_meta_shards(parts: list[dict], files: list[Path], config: LlamaConfig, where: str) -> dict[str, torch.Tensor]:
    """Concatenate Meta model-parallel shards along their split dims (new tensors, except replicated ones)."""
    n = len(parts)
    problems = []
    keys = list(parts[0])
    for f, part in zip(files[1:], parts[1:]):
        if set(part) != set(parts[0]):
            diff = sorted(set(part) ^ set(parts[0]))
            problems.append(f"{f.name} and {files[0].name} hold different tensor names ({_fmt_list(diff)})")
    if problems:
        raise InputError(f"{where}: cannot merge the shards: " + "; ".join(problems))
    merged = {}
    for k in keys:
        ts = [part[k] for part in parts]
        if any(t.shape != ts[0].shape for t in ts):
            problems.append(f"{k} has different shapes across shards ({', '.join(str(tuple(t.shape)) for t in ts)})")
            continue
        kind = k.split(".")[-2] if k.count(".") >= 1 else k
        if ts[0].dim() < 2:
            merged[k] = ts[0]  # norms, rope.freqs: replicated
        elif k == "tok_embeddings.weight":
            merged[k] = torch.cat(ts, dim=0 if ts[0].shape[1] == config.dim else 1)
        elif kind in _META_SPLIT_DIM:
            merged[k] = torch.cat(ts, dim=_META_SPLIT_DIM[kind])
        else:
            merged[k] = ts[0]  # unknown: reported as unexpected by validation
    if problems:
        raise InputError(f"{where}: cannot merge the {n} shards: {_fmt_list(problems)}")
    return merged


def _check_rope_freqs(raw: dict, config: LlamaConfig, where: str, cfg_source: str) -> None:
    """Llama 2 checkpoints carry `rope.freqs` (head_dim/2 entries): the one tensor that shows a wrong
    n_heads when every weight shape is the same for any head count (n_kv_heads == n_heads)."""
    f = raw.get("rope.freqs")
    if f is None or f.dim() != 1:
        return
    if f.shape[0] != config.head_dim // 2:
        raise InputError(f"{where}: rope.freqs has {f.shape[0]} entries, so head_dim is {2 * f.shape[0]}, but {cfg_source} gives "
                         f"head_dim = dim / n_heads = {config.dim} / {config.n_heads} = {config.head_dim}: check n_heads "
                         f"(should be {config.dim // (2 * f.shape[0])} if dim is right)")


def _check_tied_copy(raw: dict, out_name: str, emb_name: str, where: str) -> None:
    out, emb = raw.get(out_name), raw.get(emb_name)
    if out is not None and emb is not None and out.shape != emb.shape:
        raise InputError(f"{where}: the config ties the output layer to the embedding, but {out_name} has shape "
                         f"{tuple(out.shape)} and {emb_name} {tuple(emb.shape)}")
    log.debug("%s: %s present with tied embeddings; using %s", where, out_name, emb_name)


# ---- Hugging Face --------------------------------------------------------------------------------

def _load_hf(p: Path, want: torch.dtype | None, given=None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """given: (config, source) from --config, instead of the config.json beside the weights."""
    folder = p if p.is_dir() else p.parent
    cfg_path = folder / "config.json"
    if p.is_dir():
        weights = next((folder / n for n in _HF_WEIGHT_FILES if (folder / n).is_file()), None)
        if weights is None:
            raise InputError(f"{folder}: no weights found; a Hugging Face Llama folder holds model.safetensors, "
                             "model.safetensors.index.json with its shards, or pytorch_model.bin")
    elif p.name.endswith(".safetensors") and (folder / "model.safetensors.index.json").is_file() and re.fullmatch(r"model-\d+-of-\d+\.safetensors", p.name):
        weights = folder / "model.safetensors.index.json"  # one shard of a set: load the set
    elif p.name == "config.json":
        return _load_hf(folder, want)
    else:
        weights = p
    if given is not None:
        config, cfg_path = given
    elif not cfg_path.is_file():
        raise InputError(f"{cfg_path}: not found; a Hugging Face Llama checkpoint needs the config.json that came with "
                         f"{weights.name} (LlamaForCausalLM: hidden_size, num_hidden_layers, ...) in the same folder: copy it there, "
                         "or name its config with --config (e.g. --config llama3-8b)")
    else:
        config = LlamaConfig.from_hf_config(_read_json(cfg_path), source=str(cfg_path))

    # name -> (file, getter): reading the names and shapes needs no tensor data.
    if weights.name.endswith(".index.json"):
        files, index_problems = _read_index(weights)
        where = f"{weights} ({len(files)} shard(s))"
    else:
        files, index_problems = {weights: None}, []
        where = str(weights)
    found: dict[str, tuple[tuple[int, ...], str, object]] = {}  # name -> (shape, dtype, reader)
    for f, listed in files.items():
        reader = _reader(f)
        names = reader.names()
        if listed is not None:
            absent = sorted(set(listed) - set(names))
            if absent:
                index_problems.append(f"{weights.name} maps {len(absent)} tensor(s) to {f.name} that it does not hold: {_fmt_list(absent)}")
        for n in names:
            if n in found:
                index_problems.append(f"{n} appears in more than one shard")
            found[n] = (reader.shape(n), reader.dtype(n), reader)
    if index_problems:
        raise InputError(f"{where}: the shard index does not match the shards: " + "; ".join(index_problems))

    if config.tie_embeddings and "lm_head.weight" in found:
        if found["lm_head.weight"][0] != found.get("model.embed_tokens.weight", (None,))[0]:
            raise InputError(f"{where}: config.json ties the embeddings (tie_word_embeddings), but lm_head.weight has shape "
                             f"{found['lm_head.weight'][0]} and model.embed_tokens.weight {found.get('model.embed_tokens.weight', ('absent',))[0]}")
        del found["lm_head.weight"]
    expected = llama_param_shapes(config)
    _validate({n: v[0] for n, v in found.items()}, expected, _HF_IGNORED, where=where, cfg_source=str(cfg_path), config=config,
              dtypes={n: v[1] for n, v in found.items()})

    state = {}
    for name in expected:
        t = found[name][2].get(name)
        if want is not None:
            t = t.to(want)
        state[name] = t
    return config, state


def _read_index(index: Path) -> tuple[dict[Path, list[str]], list[str]]:
    data = _read_json(index)
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise InputError(f"{index}: no \"weight_map\" in this index; a sharded checkpoint index maps each tensor name to its shard file")
    files: dict[Path, list[str]] = {}
    for name, fname in wm.items():
        files.setdefault(index.parent / str(fname), []).append(name)
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise InputError(f"{index}: lists shard file(s) that do not exist: {_fmt_list([str(f) for f in missing])}; "
                         "copy the missing shard(s) into the folder, or re-download the checkpoint")
    return files, []


class _SafetensorsReader:
    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        try:
            self._f = safe_open(str(path), framework="pt", device="cpu")
            self._names = list(self._f.keys())
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for every kind of damage
            raise InputError(f"{path}: cannot be read as a safetensors file ({_one_line(e)}); it may be truncated or "
                             "corrupt: copy or download it again") from None

    def names(self):
        return self._names

    def shape(self, n):
        return tuple(self._f.get_slice(n).get_shape())

    def dtype(self, n):
        return self._f.get_slice(n).get_dtype()

    def get(self, n):
        return self._f.get_tensor(n)  # a view of the memory-mapped file


class _TorchReader:
    def __init__(self, path: Path):
        self.path = path
        self._sd = _read_torch_file(path)

    def names(self):
        return list(self._sd)

    def shape(self, n):
        return tuple(self._sd[n].shape)

    def dtype(self, n):
        return str(self._sd[n].dtype).removeprefix("torch.")

    def get(self, n):
        return self._sd[n]


def _reader(path: Path):
    return _SafetensorsReader(path) if path.suffix == ".safetensors" else _TorchReader(path)


# ---- files ---------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot be read ({_one_line(e)})") from None
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({_one_line(e)})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _read_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """torch.load(weights_only=True, mmap=True): never runs pickled code, never copies tensor data."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({_one_line(e)})") from None
    mmap = magic == b"PK\x03\x04"  # torch's zip format; the legacy pickle format can't be memory-mapped
    if not mmap and not magic.startswith(b"\x80"):
        raise InputError(f"{path}: not a PyTorch checkpoint (neither torch.save's zip format nor a pickle); "
                         "check the file, or copy or download it again")
    if mmap and not zipfile.is_zipfile(path):
        raise InputError(f"{path}: truncated or corrupt (the zip archive a PyTorch checkpoint is stored in has no end "
                         "record); copy or download the file again")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:
            raise InputError(f"{path}: holds a pickled Python object ({found.group(1)}); llmc loads with weights_only=True "
                             "and never runs code from a checkpoint: save only tensors, e.g. torch.save(model.state_dict(), path)") from None
        raise InputError(f"{path}: holds Python objects other than tensors, which llmc does not unpickle (it loads with "
                         f"weights_only=True and never runs code from a checkpoint): {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/EOFError/... for damaged files
        raise InputError(f"{path}: cannot be read as a PyTorch checkpoint ({_one_line(e)}); it may be truncated or "
                         "corrupt: copy or download it again") from None
    if not mmap:
        log.warning("%s: legacy (non-zip) PyTorch format, read into memory instead of memory-mapped", path)
    if isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in ("model", "state_dict") and isinstance(next(iter(obj.values())), dict):
        obj = next(iter(obj.values()))
    if not isinstance(obj, dict):
        raise InputError(f"{path}: holds a {type(obj).__name__}, not a state dict (a mapping of names to tensors)")
    bad = [str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"{path}: entries that are not name -> tensor: {_fmt_list(bad)}")
    return obj


# ---- validation ----------------------------------------------------------------------------------

def _validate(found: dict, expected: dict[str, tuple[int, ...]], ignored: re.Pattern, *, where: str, cfg_source: str,
              config: LlamaConfig, dtypes: dict[str, str] | None = None) -> None:
    """Raise one InputError listing every missing, unexpected, mis-shaped or non-float tensor."""
    shapes = {n: tuple(v.shape) if isinstance(v, torch.Tensor) else tuple(v) for n, v in found.items()}
    if dtypes is None:
        dtypes = {n: str(v.dtype).removeprefix("torch.") for n, v in found.items() if isinstance(v, torch.Tensor)}
    missing = [n for n in expected if n not in shapes]
    unexpected = [n for n in shapes if n not in expected and not ignored.fullmatch(n)]
    misshaped = [n for n in expected if n in shapes and shapes[n] != expected[n]]
    nonfloat = [n for n in expected if n in dtypes and not _is_float_dtype(dtypes[n])]
    if not (missing or unexpected or misshaped or nonfloat):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing: {_fmt_list(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected: {_fmt_list(unexpected)}")
    if misshaped:
        parts.append(f"{len(misshaped)} mis-shaped: " + _fmt_list([f"{n} is {shapes[n]}, expected {expected[n]}" for n in misshaped]))
    if nonfloat:
        parts.append(f"{len(nonfloat)} not floating point: " + _fmt_list([f"{n} is {dtypes[n]}" for n in nonfloat]))
    hints = []
    attn = re.compile(r".*(attention\.w[qkvo]|self_attn\.[qkvo]_proj)\.weight")
    if any(attn.fullmatch(n) for n in misshaped):
        hints.append(f"attention shapes follow dim, n_heads and n_kv_heads: check them in {cfg_source}")
    layer = re.compile(r"(?:model\.)?layers\.(\d+)\..*")
    present = {int(m.group(1)) for n in shapes if (m := layer.fullmatch(n))}
    if present and max(present) + 1 != config.n_layers:
        hints.append(f"the checkpoint has layers 0..{max(present)} but {cfg_source} gives n_layers={config.n_layers}")
    cfg = (f"dim={config.dim}, n_layers={config.n_layers}, n_heads={config.n_heads}, n_kv_heads={config.n_kv_heads}, "
           f"head_dim={config.head_dim}, ffn_dim={config.ffn_dim}, vocab_size={config.vocab_size}, tie_embeddings={config.tie_embeddings}")
    raise InputError(f"{where}: tensors do not match {cfg_source} ({cfg}): " + "; ".join(parts)
                     + ("; " + "; ".join(hints) if hints else ""))


def _is_float_dtype(s: str) -> bool:
    s = s.lower()
    return s in ("f16", "bf16", "f32", "f64") or s.startswith(("float", "bfloat"))


def _fmt_list(items: list[str], limit: int = _LIST_LIMIT) -> str:
    items = list(items)
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", ... and {len(items) - limit} more"


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    return msg if len(msg) <= 300 else msg[:300] + "..."
