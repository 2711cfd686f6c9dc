"""vecmat-as-mv, compiled for cpu and run: a vector times a matrix with dynamic K and N comes back
with eager's shape and values (rtol = atol = 1e-6: the same f32 sums, possibly in another order);
before the pass, IREE's global-opt data tiling returned it padded to 8 ([4] x [4, 5] -> 8 values)."""

import pytest
import torch
from torch.export import Dim

import llmc


class _VecMat(torch.nn.Module):
    def forward(self, v, b):
        return torch.matmul(v, b), torch.matmul(v, b).relu()


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    k, n = Dim("k", max=512), Dim("n", max=512)
    art = llmc.compile(_VecMat(), (torch.rand(4), torch.rand(4, 5)), dynamic_shapes=({0: k}, {0: k, 1: n}),
                       output=tmp_path_factory.mktemp("vm") / "vm.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "vecmat-as-mv")
    assert stats["rewrote"] == 2, stats
    return llmc.load(art)


@pytest.mark.parametrize("k, n", [(4, 5), (9, 3), (33, 100)])
def test_shape_and_values_equal_eager(mod, k, n):
    g = torch.Generator().manual_seed(k * n)
    args = (torch.randn(k, generator=g), torch.randn(k, n, generator=g))
    for got, want in zip(mod(*args), _VecMat()(*args)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
