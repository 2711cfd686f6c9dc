"""Hugging Face `transformers` causal LMs (Llama, GPT-2), tiny configs, compiled for cpu in f32 and bf16.

The models are the real transformers classes built from a config with seeded random weights; nothing is
downloaded (HF_HUB_OFFLINE=1). Written against transformers 5.23.0 with the attention implementation
the default config picks (sdpa).

torch.export of the models as they are fails while `use_cache` is on: the output then holds a
`transformers.cache_utils.DynamicCache`, which is no pytree torch.export knows. So the model itself is
exported with the example kwarg `use_cache=False`; llmc folds that into the module as a constant, and
the compiled module is called with the same kwarg. The output comes back as a dict with the keys of
the eager ModelOutput (only "logits" here).

Tolerances come from llmc.compiler.diff_metrics: f32 max relative error <= 1e-5 (and the greedy token of the
last position must agree), bf16 cosine >= 0.999 against eager bf16.

Each (model, dtype) is compiled once per module (the `compiled` fixture): the wrong-weights test reads
the Llama f32 module test_hf_causal_lm_matches_eager built.
"""

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from conftest import hf_eager

import llmc
from llmc import dtypes
from llmc.compiler import diff_metrics

transformers = pytest.importorskip("transformers")

VOCAB = 256
SEQ = 8


def build_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def build_gpt2():
    # bos/eos inside the tiny vocabulary (the default 50256 draws a config warning).
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


BUILDERS = {"llama": build_llama, "gpt2": build_gpt2}
KWARGS = {"use_cache": False}


def input_ids():
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1), dtype=torch.int64)


def eager_logits(model, ids, dtype):
    return hf_eager(model, ids, dtype, KWARGS)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(arch, dtype) -> (model, artifact): BUILDERS[arch]() (seed 0) compiled once per module."""
    root = tmp_path_factory.mktemp("hf")

    @functools.cache
    def get(arch, dtype):
        model = BUILDERS[arch]()
        return model, llmc.compile(model, (input_ids(),), dtype=dtype, example_kwargs=KWARGS, output=root / f"{arch}_{dtype}.vmfb")

    return get


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_hf_causal_lm_matches_eager(compiled, arch, dtype):
    model, art = compiled(arch, dtype)
    assert model.config._attn_implementation == "sdpa"
    ids = input_ids()

    got = llmc.load(art)(ids, **KWARGS)
    ref = eager_logits(model, ids, dtype)

    # The structure eager returns: a ModelOutput holding only logits comes back as {"logits": ...}.
    assert isinstance(got, dict) and set(got) == set(ref.keys()) == {"logits"}, (type(got), got.keys())
    ref_logits = ref.logits
    got_logits = got["logits"]
    assert got_logits.dtype == ref_logits.dtype == dtypes.compute_torch_dtype(dtype)
    assert tuple(got_logits.shape) == (1, SEQ, VOCAB)
    # The reference is not degenerate: positions differ from each other, so a wrong mask/position shows.
    assert ref_logits.float().std() > 1e-3
    assert (ref_logits[0, 0] - ref_logits[0, -1]).abs().max() > 1e-3

    r = diff_metrics.compare("logits", got_logits, ref_logits, diff_metrics.TOLERANCES[dtype])
    if dtype == "f32":
        assert r.max_rel <= 1e-5, r
        assert r.passed, r
        # Greedy next token from the last position agrees, and the check means something: eager's
        # top-2 margin is far larger than the compiled module's error.
        top2 = ref_logits[0, -1].topk(2).values
        assert (top2[0] - top2[1]).item() > 10 * r.max_abs, (top2, r)
        assert got_logits[0, -1].argmax().item() == ref_logits[0, -1].argmax().item()
    else:
        assert r.cosine >= 0.999, r
        assert r.passed, r
    # Compiling in bf16 leaves the user's model in f32.
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_hf_llama_other_weights_are_caught(compiled):
    """The comparison can fail: a module compiled from differently-seeded weights is far off (the
    seed-0 Llama's f32 module against eager on seed-1 weights)."""
    model, art = compiled("llama", "f32")
    torch.manual_seed(1)
    other = transformers.LlamaForCausalLM(model.config).eval()
    ids = input_ids()
    got = llmc.load(art)(ids, **KWARGS)
    r = diff_metrics.compare("logits", got["logits"], eager_logits(other, ids, "f32").logits, diff_metrics.TOLERANCES["f32"])
    assert not r.passed and r.max_rel > 0.1, r
