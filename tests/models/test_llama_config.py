"""LlamaConfig: named configs, Meta params.json and HF config.json in both directions.

The published files below are the real ones (Meta's params.json and HF's config.json for Llama 2/3),
so these tests check that llmc reads what users actually have, not only what llmc writes.
"""

from __future__ import annotations

import dataclasses

import pytest

from llmc.errors import InputError
from llmc.models.llama.config import CONFIGS, LlamaConfig, get_config, meta_ffn_dim

# Meta's own params.json files (as published with the weights).
META_LLAMA2_7B = {"dim": 4096, "multiple_of": 256, "n_heads": 32, "n_layers": 32, "norm_eps": 1e-05, "vocab_size": -1}
META_LLAMA3_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256, "multiple_of": 1024,
                  "ffn_dim_multiplier": 1.3, "norm_eps": 1e-05, "rope_theta": 500000.0}
META_LLAMA31_8B = {**META_LLAMA3_8B, "use_scaled_rope": True}
META_LLAMA32_1B = {"dim": 2048, "ffn_dim_multiplier": 1.5, "multiple_of": 256, "n_heads": 32, "n_kv_heads": 8, "n_layers": 16,
                   "norm_eps": 1e-05, "rope_theta": 500000.0, "use_scaled_rope": True, "vocab_size": 128256}
# HF config.json of meta-llama/Meta-Llama-3-8B and Llama-3.2-1B (abridged to the fields that matter).
HF_LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
                "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
                "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "vocab_size": 128256}
HF_LLAMA32_1B = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
                 "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "llama",
                 "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                 "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                 "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256}

SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "norm_eps", "rope_theta")


def differing(a: LlamaConfig, b: LlamaConfig) -> dict:
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_meta_params_round_trip(name):
    c = CONFIGS[name]
    back = LlamaConfig.from_meta_params(c.to_meta_params())
    assert back == c, differing(c, back)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_config_round_trip(name):
    c = CONFIGS[name]
    back = LlamaConfig.from_hf_config(c.to_hf_config())
    assert back == c, differing(c, back)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_as_dict_round_trip(name):
    assert LlamaConfig.from_dict(CONFIGS[name].as_dict()) == CONFIGS[name]


def test_meta_ffn_formula_gives_published_sizes():
    assert meta_ffn_dim(4096, 256, None) == 11008  # llama2-7b
    assert meta_ffn_dim(4096, 1024, 1.3) == 14336  # llama3-8b
    assert meta_ffn_dim(2048, 256, 1.5) == 8192  # llama3.2-1b
    assert meta_ffn_dim(5120, 256, None) == 13824  # llama2-13b


@pytest.mark.parametrize("params, name", [(META_LLAMA3_8B, "llama3-8b"), (META_LLAMA31_8B, "llama3.1-8b")])
def test_published_meta_params_match_named_config(params, name):
    c = LlamaConfig.from_meta_params(params)
    want = get_config(name)
    assert {f: getattr(c, f) for f in SHAPE_FIELDS} == {f: getattr(want, f) for f in SHAPE_FIELDS}
    assert c.rope_scaling == want.rope_scaling
    assert c.bos_id == 128000 and 128001 in c.eos_ids and not c.tie_embeddings


def test_published_meta_params_llama32_1b_shapes():
    c = LlamaConfig.from_meta_params(META_LLAMA32_1B)
    want = get_config("llama3.2-1b")
    assert {f: getattr(c, f) for f in SHAPE_FIELDS} == {f: getattr(want, f) for f in SHAPE_FIELDS}
    assert c.rope_scaling is not None


def test_meta_params_with_unset_vocab_is_rejected():
    # Llama 2's params.json ships with vocab_size -1 (the tokenizer decides).
    with pytest.raises(InputError, match=r"params\.json: vocab_size=-1"):
        LlamaConfig.from_meta_params(META_LLAMA2_7B)
    c = LlamaConfig.from_meta_params({**META_LLAMA2_7B, "vocab_size": 32000})
    assert {f: getattr(c, f) for f in SHAPE_FIELDS} == {f: getattr(CONFIGS["llama2-7b"], f) for f in SHAPE_FIELDS}
    assert c.n_kv_heads == 32 and c.bos_id == 1 and c.eos_ids == (2,)


def test_meta_params_missing_keys_named():
    with pytest.raises(InputError, match=r"my/params\.json: missing key\(s\) n_heads, vocab_size"):
        LlamaConfig.from_meta_params({"dim": 64, "n_layers": 2}, source="my/params.json")


@pytest.mark.parametrize("cfg, name", [(HF_LLAMA3_8B, "llama3-8b"), (HF_LLAMA32_1B, "llama3.2-1b")])
def test_published_hf_config_matches_named_config(cfg, name):
    c = LlamaConfig.from_hf_config(cfg)
    want = get_config(name)
    assert differing(c, want).keys() <= {"name", "eos_ids"}, differing(c, want)
    assert c.eos_ids == (128001,)


def test_hf_config_transformers5_rope_parameters():
    cfg = {k: v for k, v in HF_LLAMA32_1B.items() if k not in ("rope_scaling", "rope_theta")}
    cfg["rope_parameters"] = {**HF_LLAMA32_1B["rope_scaling"], "rope_theta": 500000.0}
    assert LlamaConfig.from_hf_config(cfg) == LlamaConfig.from_hf_config(HF_LLAMA32_1B)
    plain = {**HF_LLAMA3_8B, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    del plain["rope_theta"], plain["rope_scaling"]
    assert LlamaConfig.from_hf_config(plain).rope_scaling is None
    assert LlamaConfig.from_hf_config(plain).rope_theta == 500000.0


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "is not a Llama"),
    ({"head_dim": 256}, "head_dim=256 differs"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
])
def test_hf_config_unsupported(change, message):
    with pytest.raises(InputError, match=message):
        LlamaConfig.from_hf_config({**HF_LLAMA3_8B, **change})


@pytest.mark.parametrize("change, message", [
    ({"n_heads": 5}, "dim=64 is not divisible by n_heads=5"),
    ({"n_kv_heads": 3}, "n_heads=4 is not a multiple of n_kv_heads=3"),
    ({"n_layers": 0}, "n_layers=0 must be a positive integer"),
])
def test_invalid_config_rejected(change, message):
    with pytest.raises(InputError, match=message):
        get_config("tiny").replace(**change)


def test_unknown_config_name_lists_known():
    with pytest.raises(InputError, match="unknown Llama config 'llama9'.*tiny"):
        get_config("llama9")


def test_meta_params_without_factor_pick_the_published_rope_factor():
    from llmc.models.llama.config import LlamaConfig

    # Meta's params.json for Llama 3.2 1B and 3.1 8B (as published: no rope factor recorded)
    l32 = {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256, "ffn_dim_multiplier": 1.5,
           "multiple_of": 256, "norm_eps": 1e-05, "rope_theta": 500000.0, "use_scaled_rope": True}
    l31 = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256, "ffn_dim_multiplier": 1.3,
           "multiple_of": 1024, "norm_eps": 1e-05, "rope_theta": 500000.0, "use_scaled_rope": True}
    assert LlamaConfig.from_meta_params(l32).rope_scaling["factor"] == 32.0
    assert LlamaConfig.from_meta_params(l32).ffn_dim == 8192
    assert LlamaConfig.from_meta_params(l31).rope_scaling["factor"] == 8.0
    assert LlamaConfig.from_meta_params(l31).ffn_dim == 14336
