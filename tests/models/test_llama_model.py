"""llmc's Llama definition against transformers' LlamaForCausalLM (same weights), in eager PyTorch.

f32, so the bound is rounding only: max |diff| / max |ref| <= 1e-5 on logits (the f32 profile)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from llmc.models.llama.config import get_config  # noqa: E402
from llmc.models.llama.model import Llama, LlamaDecode, LlamaDecodeStatic, LlamaPrefill, init_random, new_cache, rope_inv_freq  # noqa: E402


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _hf(config, state_dict):
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_config())).eval()
    missing, unexpected = hf.load_state_dict(state_dict, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return hf


@pytest.mark.parametrize("name", ["tiny", "tiny-llama3"])
def test_forward_matches_transformers(name):
    config = get_config(name)
    model = init_random(config, seed=11, rope_positions=128)
    hf = _hf(config, model.state_dict())
    tokens = torch.randint(0, config.vocab_size, (2, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert _rel(model(tokens), hf(tokens, use_cache=False).logits) <= 1e-5


def test_llama31_rope_scaling_changes_low_frequencies_only():
    base = get_config("tiny-llama3")
    plain = rope_inv_freq(base.replace(rope_scaling=None))
    scaled = rope_inv_freq(base)
    assert torch.equal(scaled[0], plain[0])  # the highest frequency is untouched
    assert torch.allclose(scaled[-1], plain[-1] / base.rope_scaling["factor"])  # the lowest is divided by factor


@pytest.mark.parametrize("name", ["tiny", "tiny-llama3"])
def test_prefill_then_decode_equals_full_forward(name):
    config = get_config(name)
    model = init_random(config, seed=5, rope_positions=96)
    tokens = torch.randint(0, config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        out = LlamaPrefill(model)(tokens[:, :25], *new_cache(config, 96))
        assert out[0].shape == (1, 1, config.vocab_size)
        assert _rel(out[0][0, -1], full[0, 24]) <= 1e-5
        cache = out[1:]
        for pos in range(25, 40):
            out = LlamaDecode(model)(tokens[:, pos : pos + 1], torch.ones(1, pos + 1, dtype=torch.int64), *cache)
            cache = out[1:]
            assert _rel(out[0][0, -1], full[0, pos]) <= 1e-5, pos
        # The cache holds exactly the positions written so far; the rest is still zero.
        assert cache[0][:, :, :40].abs().sum() > 0 and cache[0][:, :, 40:].abs().sum() == 0


def test_static_decode_equals_decode_over_a_cache_with_junk_past_the_position():
    """LlamaDecodeStatic attends over the whole cache: rows past the position hold junk (a bucket
    prefill's pads) and must be masked out; its logits and written row equal LlamaDecode's."""
    config = get_config("tiny-llama3")
    model = init_random(config, seed=4, rope_positions=48)
    tokens = torch.randint(0, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = LlamaPrefill(model)(tokens[:, :20], *new_cache(config, 48))[1:]
        junk = [c.clone() for c in cache]
        for c in junk:
            c[:, :, 20:] = torch.randn(c[:, :, 20:].shape, generator=torch.Generator().manual_seed(6)) * 5
        for pos in range(20, 30):
            want = LlamaDecode(model)(tokens[:, pos : pos + 1], torch.ones(1, pos + 1, dtype=torch.int64), *cache)
            got = LlamaDecodeStatic(model)(tokens[:, pos : pos + 1], torch.tensor([pos]), *junk)
            assert _rel(got[0], want[0]) <= 1e-5, pos
            for g, w in zip(got[1:], want[1:]):
                assert _rel(g[:, :, : pos + 1], w[:, :, : pos + 1]) <= 1e-6
            cache, junk = want[1:], got[1:]


def test_decode_mask_zero_hides_a_position():
    config = get_config("tiny")
    model = init_random(config, seed=2, rope_positions=32)
    tokens = torch.randint(0, config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = LlamaPrefill(model)(tokens[:, :5], *new_cache(config, 32))[1:]
        ones = torch.ones(1, 6, dtype=torch.int64)
        masked = ones.clone()
        masked[0, 2] = 0
        a = LlamaDecode(model)(tokens[:, 5:], ones, *cache)[0]
        b = LlamaDecode(model)(tokens[:, 5:], masked, *cache)[0]
    assert (a - b).abs().max() > 1e-3


def test_tied_embeddings_share_one_tensor():
    model = init_random(get_config("tiny-llama3"), seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    rebuilt = Llama.from_state_dict(model.config, {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
    assert rebuilt.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_every_one_row_attention_has_a_mask():
    """The last layer's one-row attention in prefill, bucket and chunk, and decode's, each get a mask (an all-zero
    one in the dynamic prefill: model.py last_row_bias); the earlier layers of a prefill are causal. Without the
    mask a hip build of the tiny Llama took 275 s instead of 19 (IREE 3.13 pads a maskless one-row attention)."""
    from llmc.models.llama.model import LlamaPrefillBucket, LlamaPrefillChunk
    from tests.conftest import attention_calls

    config = get_config("tiny")
    model = init_random(config, seed=7, rope_positions=64)
    ids = torch.randint(0, config.vocab_size, (1, 21), generator=torch.Generator().manual_seed(2))
    n = config.n_layers
    calls, out = attention_calls(lambda: LlamaPrefill(model)(ids, *new_cache(config, 64)))
    assert calls == [(21, False, True)] * (n - 1) + [(1, True, False)]
    bucket, _ = attention_calls(lambda: LlamaPrefillBucket(model)(torch.cat([ids, torch.zeros(1, 3, dtype=torch.int64)], 1),
                                                                   torch.tensor([21]), *new_cache(config, 64)))
    assert bucket[-1] == (1, True, False)
    chunk, _ = attention_calls(lambda: LlamaPrefillChunk(model)(ids[:, :4], torch.ones(1, 25, dtype=torch.int64), *out[1:]))
    assert chunk[-1] == (1, True, False)
    decode, _ = attention_calls(lambda: LlamaDecode(model)(ids[:, :1], torch.ones(1, 22, dtype=torch.int64), *out[1:]))
    assert decode == [(1, True, False)] * n


@pytest.mark.parametrize("name", ["tiny", "tiny-llama3"])
def test_prefill_runs_the_last_layer_for_the_read_position_only(name):
    """Prefill, bucket and chunk give the logits and the cache of a standard forward (whole_last_layer), while the
    last layer's query and MLP see one row (its K/V and the earlier layers every row); f32, within 1e-5 of the
    largest logit."""
    from llmc.models.llama.model import LlamaPrefillBucket, LlamaPrefillChunk
    from tests.conftest import rows_through

    config = get_config(name)
    model = init_random(config, seed=7, rope_positions=64)
    ids = torch.randint(0, config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(2))
    last, first = model.model.layers[-1], model.model.layers[0]
    watched = {"last mlp": last.mlp, "last q": last.self_attn.q_proj, "last k": last.self_attn.k_proj, "first mlp": first.mlp}
    with torch.no_grad():
        whole = LlamaPrefill(model, whole_last_layer=True)(ids[:, :21], *new_cache(config, 64))
        before_chunk = LlamaPrefill(model)(ids[:, :13], *new_cache(config, 64))[1:]
        runs = {
            "prefill": lambda: LlamaPrefill(model)(ids[:, :21], *new_cache(config, 64)),
            # 21 prompt tokens padded to 30: the read position is length - 1 = 20, not the last row
            "bucket": lambda: LlamaPrefillBucket(model)(torch.cat([ids[:, :21], torch.zeros(1, 9, dtype=torch.int64)], 1),
                                                        torch.tensor([21]), *new_cache(config, 64)),
            # positions 13..20 after a prefill of 13
            "chunk": lambda: LlamaPrefillChunk(model)(ids[:, 13:21], torch.ones(1, 21, dtype=torch.int64), *before_chunk),
        }
        for form, run in runs.items():
            rows, out = rows_through(watched, run)
            assert rows["last mlp"] == [1] and rows["last q"] == [1], (form, rows)
            assert rows["last k"][0] > 1 and rows["first mlp"][0] > 1, (form, rows)  # K/V of every row: the cache needs them
            assert out[0].shape == whole[0].shape and _rel(out[0], whole[0]) <= 1e-5, form
            for a, b in zip(out[1:], whole[1:]):
                torch.testing.assert_close(a[:, :, :21], b[:, :, :21], rtol=1e-5, atol=1e-6)
        # the whole form really runs the last layer over every row (what the benchmarks time as eager)
        rows, _ = rows_through(watched, lambda: LlamaPrefill(model, whole_last_layer=True)(ids[:, :21], *new_cache(config, 64)))
    assert rows["last mlp"] == [21]
