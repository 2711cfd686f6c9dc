"""A tiny Hugging Face `MixtralForCausalLM` (mixture of experts) compiled for cpu in f32 and bf16.

The real transformers class from a config with seeded random weights (nothing downloaded), library
defaults apart from the sizes, so the experts run transformers 5's default implementation
("grouped_mm": sort the (token, expert) pairs, histc, grouped matrix products; the
decompose-moe and sort-by-rank passes). Exported and compared as tests/e2e/test_transformers.py
does: `use_cache=False` folded in, logits from the ModelOutput dict.

Tolerances (llmc.compiler.diff_metrics, as test_transformers.py): f32 max relative error <= 1e-5 and
the greedy token of the last position equal, with a top-2 margin far above the error; bf16 (bf16
weights, f32 math on cpu) against eager bf16: cosine >= 0.999 and the bf16 profile passed.
"""

import pytest
import torch

from conftest import hf_eager

import llmc
from llmc import dtypes
from llmc.compiler import diff_metrics

transformers = pytest.importorskip("transformers")

VOCAB = 256
KWARGS = {"use_cache": False}


def build_mixtral():
    cfg = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).eval()


def input_ids(seq: int):
    return torch.randint(0, VOCAB, (1, seq), generator=torch.Generator().manual_seed(1), dtype=torch.int64)


def eager_logits(model, ids, dtype):
    return hf_eager(model, ids, dtype, KWARGS).logits


def _forms(art) -> dict:
    return {p["name"]: p["forms"] for p in art.read_manifest()["passes"] if p["name"] in ("decompose-moe", "sort-by-rank")}


def _compile_and_compare(tmp_path, dtype, seq):
    model = build_mixtral()
    assert model.config._experts_implementation == "grouped_mm"  # the path the issue is about
    ids = input_ids(seq)
    art = llmc.compile(model, (ids,), dtype=dtype, target="cpu", example_kwargs=KWARGS, output=tmp_path / f"mixtral_{dtype}.vmfb")
    got = llmc.load(art)(ids, **KWARGS)["logits"]
    ref = eager_logits(model, ids, dtype)
    assert got.dtype == ref.dtype == dtypes.compute_torch_dtype(dtype)
    assert tuple(got.shape) == (1, seq, VOCAB)
    assert ref.float().std() > 1e-3  # not degenerate
    return art, got, ref, diff_metrics.compare("logits", got, ref, diff_metrics.TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mixtral_matches_eager(dtype, tmp_path):
    art, got, ref, r = _compile_and_compare(tmp_path, dtype, seq=8)
    # 8 tokens x top-2 = 16 rows > 4 experts: every expert's product, each row's own selected.
    assert _forms(art) == {"decompose-moe": {"dense": 4, "histc": 2}, "sort-by-rank": {"sort": 2, "topk": 2}}, _forms(art)
    if dtype == "f32":
        assert r.max_rel <= 1e-5 and r.passed, r
        top2 = ref[0, -1].topk(2).values
        assert (top2[0] - top2[1]).item() > 10 * r.max_abs, (top2, r)
        assert got[0, -1].argmax().item() == ref[0, -1].argmax().item()
    else:
        assert r.cosine >= 0.999 and r.passed, r


@pytest.mark.slow
def test_mixtral_one_token_gathers_expert_weights(tmp_path):
    """A one-token call (2 rows <= 4 experts) reads only its experts' weights (the gather form);
    test_decompose_moe_numerics.py covers that form on its own."""
    art, got, ref, r = _compile_and_compare(tmp_path, "f32", seq=1)
    assert _forms(art)["decompose-moe"] == {"gather": 4, "histc": 2}, _forms(art)
    assert r.max_rel <= 1e-5 and r.passed, r
    assert got[0, -1].argmax().item() == ref[0, -1].argmax().item()
