"""Llama model configurations: the named sizes, and conversion from/to Meta's params.json and HF's config.json.

One dataclass, `LlamaConfig`, describes every Llama the definition in `model.py` can build. Named
configs (`CONFIGS`, `get_config(name)`) hold the published shapes of llama2-7b, llama3-8b,
llama3.1-8b and llama3.2-1b plus small test sizes that compile in seconds.
"""

from __future__ import annotations

import dataclasses
import math

from llmc.errors import InputError


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama-3.1 frequency scaling: {"factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}; None = plain RoPE.
    rope_scaling: dict | None = None
    max_seq_len: int = 4096  # the model's context window (the compiled cache may be shorter)
    tie_embeddings: bool = False
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    name: str = "custom"

    def __post_init__(self):
        problems = []
        for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                problems.append(f"{f}={getattr(self, f)!r} must be a positive integer")
        if not problems:
            if self.dim % self.n_heads:
                problems.append(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
            elif self.n_heads % self.n_kv_heads:
                problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
            elif self.head_dim % 2:
                problems.append(f"head_dim={self.head_dim} (dim / n_heads) must be even for RoPE")
        if problems:
            raise InputError(f"invalid Llama config {self.name!r}: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def replace(self, **changes) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eos_ids"] = list(self.eos_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        d = dict(d)
        d["eos_ids"] = tuple(d.get("eos_ids", ()))
        return cls(**d)

    # ---- Meta params.json ------------------------------------------------------------------
    @classmethod
    def from_meta_params(cls, p: dict, *, source: str = "params.json") -> "LlamaConfig":
        """Meta's params.json: dim, n_layers, n_heads, n_kv_heads?, vocab_size, multiple_of,
        ffn_dim_multiplier?, norm_eps, rope_theta?, use_scaled_rope?."""
        missing = [k for k in ("dim", "n_layers", "n_heads", "vocab_size") if k not in p]
        if missing:
            raise InputError(f"{source}: missing key(s) {', '.join(missing)}; a Meta Llama params.json has dim, n_layers, n_heads, vocab_size")
        if p["vocab_size"] is None or p["vocab_size"] <= 0:
            raise InputError(f"{source}: vocab_size={p['vocab_size']!r}; set it to the tokenizer's vocabulary size")
        dim = p["dim"]
        ffn = meta_ffn_dim(dim, p.get("multiple_of", 256), p.get("ffn_dim_multiplier"))
        scaling = None
        if p.get("use_scaled_rope"):
            # Meta's reference code hard-codes these for Llama 3.1/3.2 (factor 8; 3.2 small models use 32).
            # A params.json written by to_meta_params also carries the full set under "rope_scaling"
            # (an llmc extra key), so that non-default values survive a round trip.
            given = p.get("rope_scaling") if isinstance(p.get("rope_scaling"), dict) else {}
            # Meta's own params.json never records the factor: 8 for Llama 3.1 (dim 4096 and up), 32 for
            # the Llama 3.2 1B/3B text models (dim 2048 / 3072), as Meta's reference code and HF's configs have it.
            default_factor = 32.0 if dim <= 3072 and p["vocab_size"] >= 128000 else 8.0
            scaling = {
                "factor": float(given.get("factor", p.get("rope_scaling_factor", default_factor))),
                "low_freq_factor": float(given.get("low_freq_factor", 1.0)),
                "high_freq_factor": float(given.get("high_freq_factor", 4.0)),
                "original_max_position_embeddings": int(given.get("original_max_position_embeddings", 8192)),
            }
        big_vocab = p["vocab_size"] >= 128000
        return cls(
            dim=dim,
            n_layers=p["n_layers"],
            n_heads=p["n_heads"],
            n_kv_heads=p.get("n_kv_heads") or p["n_heads"],
            vocab_size=p["vocab_size"],
            ffn_dim=ffn,
            norm_eps=float(p.get("norm_eps", 1e-5)),
            rope_theta=float(p.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            max_seq_len=int(p.get("max_seq_len", 8192 if big_vocab else 4096)),
            tie_embeddings=bool(p.get("tie_embeddings", False)),
            bos_id=p.get("bos_id", 128000 if big_vocab else 1),
            eos_ids=tuple(p["eos_ids"]) if "eos_ids" in p else ((128001, 128009) if big_vocab else (2,)),
            name=p.get("name", "meta-checkpoint"),
        )

    def to_meta_params(self) -> dict:
        """A params.json for this config. multiple_of/ffn_dim_multiplier are chosen so that Meta's
        formula gives back ffn_dim exactly; non-Meta fields that matter here are kept as extra keys."""
        multiple_of, mult = _meta_ffn_args(self.dim, self.ffn_dim)
        p = {
            "dim": self.dim,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "vocab_size": self.vocab_size,
            "multiple_of": multiple_of,
            "ffn_dim_multiplier": mult,
            "norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "use_scaled_rope": self.rope_scaling is not None,
            "max_seq_len": self.max_seq_len,
            "tie_embeddings": self.tie_embeddings,
            "bos_id": self.bos_id,
            "eos_ids": list(self.eos_ids),
            "name": self.name,
        }
        if self.rope_scaling is not None:
            p["rope_scaling_factor"] = self.rope_scaling["factor"]
            p["rope_scaling"] = dict(self.rope_scaling)
        return p

    # ---- Hugging Face config.json ------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, c: dict, *, source: str = "config.json") -> "LlamaConfig":
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size") if k not in c]
        if missing:
            raise InputError(f"{source}: missing key(s) {', '.join(missing)}; is this a LlamaForCausalLM config.json?")
        arch = c.get("architectures") or ["LlamaForCausalLM"]
        if c.get("model_type", "llama") != "llama" and "LlamaForCausalLM" not in arch:
            raise InputError(f"{source}: model_type {c.get('model_type')!r} is not a Llama; llmc reads LlamaForCausalLM checkpoints")
        hd = c.get("head_dim")
        if hd is not None and hd != c["hidden_size"] // c["num_attention_heads"]:
            raise InputError(f"{source}: head_dim={hd} differs from hidden_size / num_attention_heads; llmc's Llama does not support that")
        scaling = c.get("rope_scaling") or (c.get("rope_parameters") if (c.get("rope_parameters") or {}).get("rope_type") == "llama3" else None)
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "default", None):
                raise InputError(f"{source}: rope_scaling type {kind!r} is not supported (llmc supports llama3)")
            scaling = None if kind == "default" else {
                "factor": float(scaling["factor"]),
                "low_freq_factor": float(scaling["low_freq_factor"]),
                "high_freq_factor": float(scaling["high_freq_factor"]),
                "original_max_position_embeddings": int(scaling["original_max_position_embeddings"]),
            }
        theta = c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        eos = c.get("eos_token_id")
        return cls(
            dim=c["hidden_size"],
            n_layers=c["num_hidden_layers"],
            n_heads=c["num_attention_heads"],
            n_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
            vocab_size=c["vocab_size"],
            ffn_dim=c["intermediate_size"],
            norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_seq_len=int(c.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)),
            bos_id=c.get("bos_token_id"),
            eos_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            name=c.get("_name_or_path") or "hf-checkpoint",
        )

    def to_hf_config(self) -> dict:
        c = {
            "_name_or_path": self.name,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.ffn_dim,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_id,
            "eos_token_id": list(self.eos_ids) if len(self.eos_ids) > 1 else (self.eos_ids[0] if self.eos_ids else None),
        }
        if self.rope_scaling is not None:
            c["rope_scaling"] = {"rope_type": "llama3", **self.rope_scaling}
        return c


def meta_ffn_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """Meta's FeedForward hidden size: 2/3 of 4*dim, times the multiplier, rounded up to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _meta_ffn_args(dim: int, ffn_dim: int) -> tuple[int, float | None]:
    for multiple_of in (256, 1024, 128, 64, 32, 16, 8, 4, 2, 1):
        if ffn_dim % multiple_of:
            continue
        if meta_ffn_dim(dim, multiple_of, None) == ffn_dim:
            return multiple_of, None
        base = int(2 * (4 * dim) / 3)
        # Smallest multiplier m with multiple_of * ceil(int(m * base) / multiple_of) == ffn_dim.
        for target in range(ffn_dim - multiple_of + 1, ffn_dim + 1):
            m = target / base
            for cand in (m, math.nextafter(m, math.inf)):
                if meta_ffn_dim(dim, multiple_of, cand) == ffn_dim:
                    return multiple_of, cand
    raise InputError(f"ffn_dim={ffn_dim} cannot be expressed with Meta's multiple_of/ffn_dim_multiplier for dim={dim}")


_L31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

CONFIGS: dict[str, LlamaConfig] = {
    c.name: c
    for c in (
        LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, ffn_dim=11008,
                    norm_eps=1e-5, rope_theta=10000.0, max_seq_len=4096, bos_id=1, eos_ids=(2,), name="llama2-7b"),
        LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
                    norm_eps=1e-5, rope_theta=500000.0, max_seq_len=8192, bos_id=128000, eos_ids=(128001, 128009), name="llama3-8b"),
        LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
                    norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_L31_SCALING, max_seq_len=131072,
                    bos_id=128000, eos_ids=(128001, 128008, 128009), name="llama3.1-8b"),
        LlamaConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192,
                    norm_eps=1e-5, rope_theta=500000.0, rope_scaling={**_L31_SCALING, "factor": 32.0}, max_seq_len=131072,
                    tie_embeddings=True, bos_id=128000, eos_ids=(128001, 128008, 128009), name="llama3.2-1b"),
        # Test sizes: compile in seconds, exercise GQA, rope scaling and tied embeddings.
        LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=176,
                    norm_eps=1e-5, rope_theta=10000.0, max_seq_len=256, bos_id=1, eos_ids=(2,), name="tiny"),
        LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=512, ffn_dim=192,
                    norm_eps=1e-5, rope_theta=500000.0,
                    rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                    max_seq_len=512, tie_embeddings=True, bos_id=1, eos_ids=(2,), name="tiny-llama3"),
        LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, vocab_size=32000, ffn_dim=2048,
                    norm_eps=1e-5, rope_theta=10000.0, max_seq_len=2048, bos_id=1, eos_ids=(2,), name="small-125m"),
    )
}


def get_config(name: str) -> LlamaConfig:
    if name not in CONFIGS:
        raise InputError(f"unknown Llama config {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[name]
