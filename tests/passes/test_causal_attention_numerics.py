"""decompose-attention's causal and masked forms (passes/decompose_attention.py) against PyTorch's own SDPA.

Eager: the form's torch code against `F.scaled_dot_product_attention(is_causal=True)` in f64 (grouped
heads, S != L both ways, one row), and with a bool mask (rows that keep nothing included). Compiled: a
dynamic-length causal attention, and a chunk's attention over a longer dynamic cache with its bool mask
(as LlamaPrefillChunk makes it), through llmc on cpu against eager PyTorch at several lengths, so the
masked max and exponent IREE fuses are checked too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import llmc
from llmc.passes.decompose_attention import _causal_form_refusal, _decode_form_refusal, causal_attention, decode_attention


def _reference(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1]).float()


@pytest.mark.parametrize("hq, hk, s, length", [(4, 2, 6, 6), (6, 2, 5, 9), (2, 2, 7, 3), (4, 1, 1, 5), (3, 3, 16, 16)])
def test_causal_form_matches_sdpa(hq, hk, s, length):
    g = torch.Generator().manual_seed(hq * 100 + s * 10 + length)
    q = torch.randn(2, hq, s, 8, generator=g) * 3  # large scores: the max subtraction matters
    k, v = torch.randn(2, hk, length, 8, generator=g) * 3, torch.randn(2, hk, length, 8, generator=g)
    assert _causal_form_refusal(q, k, v, None, 0.0, True) is None
    got = causal_attention(q, k, v, 8**-0.5)
    want = _reference(q, k, v)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the mask is what makes it causal: without it row 0 would mix in every value row
    assert not torch.allclose(got[:, :, 0], F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hk)[:, :, 0], atol=1e-3)


def test_causal_form_declines_what_it_does_not_cover():
    q, kv = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    assert _causal_form_refusal(q, kv, kv, None, 0.0, False) == "no mask"
    assert _causal_form_refusal(q, kv, kv, torch.zeros(1, 1, 3, 3), 0.0, False) == "a float mask"
    assert _causal_form_refusal(q, kv, kv, torch.ones(1, 4, 3, 3, dtype=torch.bool), 0.0, False) == "mask not [B or 1, 1, S or 1, L]"
    assert _causal_form_refusal(q, kv, kv, torch.zeros(1, 1, 3, 3), 0.0, True) == "a mask besides is_causal"
    assert _causal_form_refusal(q.half(), kv.half(), kv.half(), None, 0.0, True) == "not f32"
    assert _causal_form_refusal(q, kv, kv, None, 0.1, True) == "dropout"
    assert _causal_form_refusal(torch.randn(1, 3, 3, 8), kv, kv, None, 0.0, True) == "query heads not a multiple of KV heads"


@pytest.mark.parametrize("hq, hk, s, length, mask_batch", [(4, 2, 3, 7, 1), (6, 2, 5, 5, 2), (2, 2, 1, 4, 2), (4, 1, 4, 9, 1)])
def test_masked_form_matches_sdpa(hq, hk, s, length, mask_batch):
    g = torch.Generator().manual_seed(hq * 100 + s * 10 + length)
    q = torch.randn(2, hq, s, 8, generator=g) * 3
    k, v = torch.randn(2, hk, length, 8, generator=g) * 3, torch.randn(2, hk, length, 8, generator=g)
    keep = torch.rand(mask_batch, 1, s, length, generator=g) > 0.4
    keep[..., 0, :] = False  # a row that keeps no key: PyTorch gives 0 there
    if s > 1:
        keep[..., -1, :] = True
    assert _causal_form_refusal(q, k, v, keep, 0.0, False) is None
    got = causal_attention(q, k, v, 8**-0.5, keep)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep, enable_gqa=hq != hk).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got[:, :, 0] == 0).all()
    # the mask matters: the last row keeps every key, the others differ from an unmasked attention
    unmasked = F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hk)
    if s > 2:
        assert not torch.allclose(got[:, :, 1:-1], unmasked[:, :, 1:-1], atol=1e-3)


class _Prefill(torch.nn.Module):
    """A prefill's attention: q/k/v projected from x (dynamic length), grouped heads, causal."""

    def __init__(self):
        super().__init__()
        self.q, self.kv = torch.nn.Linear(16, 16, bias=False), torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 4).transpose(1, 2)
        k = self.kv(x).view(b, s, 2, 4).transpose(1, 2)
        v = (self.kv(x) * 0.5).view(b, s, 2, 4).transpose(1, 2)
        return F.scaled_dot_product_attention(q * 4, k, v, is_causal=True, enable_gqa=True)


def test_compiled_causal_form_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = _Prefill().eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    art = llmc.compile(model, (torch.randn(1, 8, 16),), dynamic_shapes=({1: seq},), output=tmp_path / "m.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "decompose-attention")
    assert stats["forms"] == {"causal": 1}
    mod = llmc.load(art)
    for s in (2, 9, 33, 64):
        x = torch.randn(1, s, 16)
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(torch.as_tensor(mod(x)), want, rtol=1e-4, atol=1e-5)


class _Chunk(torch.nn.Module):
    """A prefill chunk's attention (LlamaPrefillChunk): 4 new rows at the end of a dynamic-length cache,
    each seeing the cache up to its own position and where `mask` is 1."""

    def __init__(self):
        super().__init__()
        self.q, self.kv = torch.nn.Linear(16, 16, bias=False), torch.nn.Linear(16, 8, bias=False)

    def forward(self, x, cache, mask):
        c, n = x.shape[1], cache.shape[1]
        q = self.q(x).view(1, c, 4, 4).transpose(1, 2)
        k = self.kv(cache).view(1, n, 2, 4).transpose(1, 2)
        v = (self.kv(cache) * 0.5).view(1, n, 2, 4).transpose(1, 2)
        keep = (torch.arange(n).unsqueeze(0) <= torch.arange(n - c, n).unsqueeze(1)) & (mask != 0)
        return F.scaled_dot_product_attention(q * 4, k, v, attn_mask=keep[None, None], enable_gqa=True)


def test_compiled_masked_form_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = _Chunk().eval()
    n = torch.export.Dim("n", min=4, max=64)
    args = (torch.randn(1, 4, 16), torch.randn(1, 8, 16), torch.ones(1, 8, dtype=torch.int64))
    art = llmc.compile(model, args, dynamic_shapes=(None, {1: n}, {1: n}), output=tmp_path / "m.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "decompose-attention")
    assert stats["forms"] == {"masked": 1}
    mod = llmc.load(art)
    for length in (4, 11, 64):
        x, cache = torch.randn(1, 4, 16), torch.randn(1, length, 16)
        mask = torch.ones(1, length, dtype=torch.int64)
        mask[0, 1] = 0
        with torch.no_grad():
            want = model(x, cache, mask)
        torch.testing.assert_close(torch.as_tensor(mod(x, cache, mask)), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("float_mask", [True, False])
def test_decode_form_matches_sdpa_with_rows_that_keep_nothing(float_mask):
    """The decode form (one query row) against PyTorch's SDPA in f64, with a batch row whose every key is
    masked: PyTorch gives 0 there (torch 2.13), and so must the form (torch.softmax gave NaN)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, 6, 1, 8, generator=g) * 3
    k, v = torch.randn(3, 2, 9, 8, generator=g) * 3, torch.randn(3, 2, 9, 8, generator=g)
    keep = torch.rand(3, 1, 1, 9, generator=g) > 0.4
    keep[0] = False
    keep[1, ..., 0] = True
    keep[2] = True
    mask = torch.zeros(keep.shape).masked_fill(keep.logical_not(), float("-inf")) if float_mask else keep
    assert _decode_form_refusal(q, k, v, mask, 0.0, False) is None
    got = decode_attention(q, k, v, mask, 8**-0.5)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask if not float_mask else mask.double(),
                                          enable_gqa=True).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).all() and (got[1:].abs().amax((1, 2, 3)) > 0.1).all()


class _Decode(torch.nn.Module):
    """A batch of decode steps' attention: one query row per sequence over a dynamic-length cache,
    an additive mask per sequence (batch 2: the C decode kernel takes batch 1 only, so this is the form's)."""

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def test_compiled_decode_form_gives_zero_where_every_key_is_masked(tmp_path):
    n = torch.export.Dim("n", min=2, max=64)
    g = torch.Generator().manual_seed(3)
    args = lambda length: (torch.randn(2, 4, 1, 8, generator=g) * 3, torch.randn(2, 2, length, 8, generator=g) * 3,
                           torch.randn(2, 2, length, 8, generator=g), torch.zeros(2, 1, 1, length))
    art = llmc.compile(_Decode(), args(5), dynamic_shapes=(None, {2: n}, {2: n}, {3: n}), output=tmp_path / "m.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "decompose-attention")
    assert stats["forms"] == {"decode": 1}
    mod = llmc.load(art)
    for length in (2, 13, 64):
        q, k, v, mask = args(length)
        mask[0] = float("-inf")  # sequence 0 attends to nothing
        mask[1, ..., length // 2:] = float("-inf")
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        got = torch.as_tensor(mod(q, k, v, mask))
        assert torch.isfinite(got).all() and (got[0] == 0).all()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
