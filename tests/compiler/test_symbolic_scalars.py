"""Float arithmetic on a dynamic size: torch-mlir's FX importer takes neither `torch.sym_float` nor
`pow` of a symbolic float, so these programs did not import ("FIX ME: Unimplemented call_function:
target=<function sym_float ...>", "Unsupported builtin function for symbolic types: <built-in function
pow>"). Now: attention with a dynamic head dim and no explicit scale (decompose-attention applies
1/sqrt(D) as a 0-d tensor), and nearest upsampling by a scale factor of a dynamic length (sym_float
imported as aten.Float.Scalar) match eager. Tolerances: attention 1e-5 absolute and relative (f32,
the scale applied to q alone where eager's math form splits it between q and k); upsampling gathers,
so exact."""

import torch
from torch.export import Dim

import llmc


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Upsample(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten.upsample_nearest1d.vec(x, output_size=None, scale_factors=[3.0])


def _qkv(b, s, d, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, s, d, generator=g) for _ in range(3))


def test_attention_with_a_dynamic_head_dim_matches_eager(tmp_path):
    b, s, d = Dim("b", max=8), Dim("s", min=2, max=64), Dim("d", min=2, max=64)
    ep = torch.export.export(_Attention(), _qkv(2, 5, 5, 0), dynamic_shapes=tuple({0: b, 1: s, 2: d} for _ in range(3)))
    art = llmc.compile(ep, output=tmp_path / "a.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "decompose-attention")
    assert stats["forms"] == {"general": 2}, stats
    mod = llmc.load(art)
    for shape in ((2, 5, 5), (3, 9, 16)):
        args = _qkv(*shape, seed=shape[2])
        for got, want in zip(mod(*args), _Attention()(*args)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_upsampling_a_dynamic_length_by_a_scale_matches_eager(tmp_path):
    n = Dim("n", min=2, max=256)
    ep = torch.export.export(_Upsample(), (torch.rand(1, 2, 6),), dynamic_shapes=({2: n},))
    assert any(node.target is torch.sym_float for node in ep.run_decompositions().graph.nodes), "no sym_float left to test"
    mod = llmc.load(llmc.compile(ep, output=tmp_path / "u.vmfb"))
    for length in (6, 11):
        x = torch.rand(1, 2, length)
        got, want = mod(x), _Upsample()(x)
        assert got.shape == want.shape and torch.equal(got, want), (length, got.shape, want.shape)
