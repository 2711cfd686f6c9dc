"""Numerics of the SPIR-V dtype rewrites, in eager PyTorch (the compiled side is tests/e2e/test_gpu_targets.py).

- half-matmul attention (passes/decompose_attention.py) against PyTorch's SDPA computed in f32 on the
  same f16 inputs: within 2e-3 of the output's largest magnitude (f16 operands with f32
  accumulation and an f16 probability matrix; eager f16 SDPA itself is off by ~1e-3 at these sizes).
- the bf16 widening (passes/bf16_weights.py): all 65536 bit patterns, bit-exact against torch's own
  bf16 -> f32 conversion.
- the bf16-weights pass on an exported program: weights become int16 bf16 bits, a written buffer is
  left alone, and the rewritten program computes exactly what the model does with bf16-rounded
  weights in f32.
"""

import pytest
import torch
import torch.nn.functional as F

from llmc.compiler import pipeline, targets
from llmc.passes.bf16_weights import widen_bf16_bits
from llmc.passes.decompose_attention import _half_matmul_refusal, half_matmul_attention


def _ref(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True, **kw)


@pytest.mark.parametrize(
    "shape_q,shape_kv,mask_kind,causal",
    [
        ((1, 8, 1, 64), (1, 2, 37, 64), "float-broadcast", False),  # decode step, GQA 4:1, [B,1,1,L] mask
        ((1, 4, 9, 32), (1, 4, 9, 32), None, True),  # prefill, causal
        ((2, 4, 5, 16), (2, 1, 12, 16), "bool-full", False),  # MQA, per-head bool mask
        ((1, 4, 3, 16), (1, 2, 7, 16), None, True),  # causal with more keys than queries: top-left aligned
    ],
)
def test_half_matmul_attention_matches_sdpa(shape_q, shape_kv, mask_kind, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*shape_q, generator=g).half()
    k = torch.randn(*shape_kv, generator=g).half()
    v = torch.randn(*shape_kv, generator=g).half()
    b, hq, s, _ = shape_q
    length = shape_kv[2]
    mask = None
    if mask_kind == "float-broadcast":
        mask = torch.zeros(b, 1, 1, length)
        mask[..., :3] = float("-inf")
        mask = mask.half()
    elif mask_kind == "bool-full":
        mask = torch.rand(b, hq, s, length, generator=g) > 0.3
        mask[..., 0] = True  # no fully masked row
    assert _half_matmul_refusal(q, k, v, mask, 0.0, causal) is None
    got = half_matmul_attention(q, k, v, mask, causal)
    want = _ref(q, k, v, attn_mask=mask if mask is None or mask.dtype == torch.bool else mask.float(), is_causal=causal)
    assert got.dtype == torch.float16 and got.shape == want.shape
    err = (got.float() - want).abs().max().item() / want.abs().max().item()
    assert err < 2e-3, err


def test_half_matmul_declines_what_it_does_not_cover():
    q, kv = torch.randn(1, 4, 2, 8).half(), torch.randn(1, 2, 5, 8).half()
    assert _half_matmul_refusal(q.float(), kv.float(), kv.float(), None, 0.0, False) == "not f16"
    assert _half_matmul_refusal(q, kv, kv, None, 0.1, False) == "dropout"
    assert _half_matmul_refusal(torch.randn(1, 3, 2, 8).half(), kv, kv, None, 0.0, False) == "query heads not a multiple of KV heads"


def test_bf16_widening_is_exact_for_every_bit_pattern():
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    got = widen_bf16_bits(bits)
    want = bits.view(torch.bfloat16).float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))  # bit for bit, -0.0 and inf included


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.register_buffer("scale", torch.linspace(0.1, 3.3, 8))
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        y = self.lin(x) * self.scale
        self.seen.add_(y.sum(0))
        return y


def test_bf16_weights_pass_stores_bits_and_computes_like_bf16_weights():
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(4, 16)
    program = torch.export.export(model, (x,))
    plan = pipeline.build(targets.resolve("vulkan", None, "bf16"), only=["bf16-weights"])
    program = plan.graph[0].run(program)
    assert {k: v.dtype for k, v in program.state_dict.items()} == {
        "lin.weight": torch.int16, "lin.bias": torch.int16, "scale": torch.int16, "seen": torch.float32,
    }
    stats = plan.stats()[0]
    assert (stats["rewrote"], stats["declined"]) == (3, 1)
    # Eager reference: the same model with its weights rounded to bf16 and computed in f32.
    ref = _Model()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name in ("lin.weight", "lin.bias", "scale"):
            t = ref.get_parameter(name) if name.startswith("lin") else ref.get_buffer(name)
            t.copy_(t.to(torch.bfloat16).float())
    want = ref(x)
    got = program.module()(x)
    assert torch.equal(got, want)
    assert not torch.equal(got, model(x))  # the rounding is visible: the test can tell the two apart
