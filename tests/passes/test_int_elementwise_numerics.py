"""int-elementwise and isfinite, compiled for cpu and run against eager PyTorch, static and dynamic:
clamp of int64 by float bounds (f32 result), int32/int64 pow of tensors with overflow and negative
exponents, a mixed int64/f32 threshold_backward (f32 result), and isfinite of f32 values with NaN,
+-inf, -0.0 and of int64. All exact: every value is a conversion, a comparison, a selection or a
wrapping integer product; floor division of int64 near 2^63 (the float route rounded) too."""

import math

import torch
from torch.export import Dim

import llmc


class _Ops(torch.nn.Module):
    def forward(self, x, b32, e32, b64, e64, g, s, f, n):
        return (torch.clamp(x, -2.5, 2.5), torch.pow(b32, e32), torch.pow(b64, e64),
                torch.ops.aten.threshold_backward(g, s, 0.5), torch.isfinite(f), torch.isfinite(n),
                torch.div(b64 * 2**59 + 5, 2**30, rounding_mode="floor"), torch.div(g, -4, rounding_mode="floor"), g // (b64 + 8))


def _args(k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ints = lambda lo, hi, dtype: torch.randint(lo, hi, (k, 3), generator=g, dtype=dtype)
    f = torch.randn(k, 3, generator=g)
    f[0] = torch.tensor([math.nan, math.inf, -math.inf])
    f[1, 0] = -0.0
    e64 = ints(-3, 70, torch.int64)  # 7**69 wraps int64
    return (ints(-6, 6, torch.int64), ints(-4, 5, torch.int32), ints(-2, 40, torch.int32), ints(-7, 8, torch.int64), e64,
            ints(-9, 9, torch.int64), torch.rand(k, 3, generator=g), f, ints(-9, 9, torch.int64))


def test_int_elementwise_and_isfinite_equal_eager(tmp_path):
    k = Dim("k", min=2, max=64)
    art = llmc.compile(_Ops(), _args(4, 0), dynamic_shapes=tuple({0: k} for _ in range(9)), output=tmp_path / "o.vmfb")
    passes = {p["name"]: p for p in art.read_manifest()["passes"]}
    assert passes["int-elementwise"]["forms"] == {"clamp": 1, "div_floor": 3, "pow": 2, "threshold_backward": 1}, passes["int-elementwise"]
    assert passes["isfinite"]["forms"] == {"float": 1, "integer": 1}, passes["isfinite"]
    mod = llmc.load(art)
    for rows in (4, 11):
        args = _args(rows, rows)
        for i, (got, want) in enumerate(zip(mod(*args), _Ops()(*args))):
            assert got.dtype == want.dtype and torch.equal(got, want), (rows, i, got, want)
