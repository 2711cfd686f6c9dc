"""prims-as-aten, compiled for cpu and run: prims.squeeze, view_of, split_dim and prod called directly
give eager PyTorch's values and shapes, with dynamic sizes run at two sizes each. Before the pass,
run_decompositions refused the three aliasing ops ("Found a custom (non-ATen) operator whose output
has alias annotations") and torch-mlir did not lower prims.prod. Everything but the products is moved,
not computed: equal exactly; the products within 1e-6 relative (IREE may multiply in another order)."""

import torch
from torch.export import Dim

import llmc

prims = torch.ops.prims


class _Prims(torch.nn.Module):
    def forward(self, a, b, c):
        return (prims.squeeze(a, [0, 3]), prims.view_of(b) * 2, prims.split_dim(c, 1, 4),
                prims.prod(b, [0, 2]), prims.prod(c, [1]))


def _args(n: int, m: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, n, 3, 1, generator=g), torch.rand(n, m, 5, generator=g) + 0.5, torch.rand(2, 4 * m, generator=g)


def test_prims_equal_eager(tmp_path):
    n, m = Dim("n", min=2, max=16), Dim("m", min=2, max=16)
    art = llmc.compile(_Prims(), _args(3, 4, 0), dynamic_shapes=({1: n}, {0: n, 1: m}, {1: 4 * m}), output=tmp_path / "p.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "prims-as-aten")
    assert stats["forms"] == {"prod": 2, "split_dim": 1, "squeeze": 1, "view_of": 1}, stats
    mod = llmc.load(art)
    for shape in ((3, 4, 1), (7, 2, 2)):
        args = _args(*shape)
        got, want = mod(*args), _Prims()(*args)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (shape, i, g.dtype, g.shape, w.shape)
            if i < 3:
                assert torch.equal(g, w), (shape, i)
            else:
                torch.testing.assert_close(g, w, rtol=1e-6, atol=0)
