"""adaptive-max-pool, compiled for cpu and run: values and indices equal eager PyTorch's exactly
(gathered, never computed) for 1-d, 2-d (output larger than the input along one axis, ties from
small integer values) and 3-d adaptive max pooling, the batch and spatial sizes dynamic and run at
two sizes each; IREE rejected torch-mlir's own lowering ("unexpected loop dimension for convolution
op")."""

import torch
from torch.export import Dim

import llmc


class _Pools(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p2 = torch.nn.AdaptiveMaxPool2d((7, 13), return_indices=True)
        self.p1 = torch.nn.AdaptiveMaxPool1d(7)
        self.p3 = torch.nn.AdaptiveMaxPool3d((2, 3, 2), return_indices=True)

    def forward(self, x, y, z):
        v2, i2 = self.p2(x)
        v3, i3 = self.p3(z)
        return v2, i2, self.p1(y), v3, i3


def _args(b: int, h: int, w: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ties = torch.randint(0, 3, (b, 5, h, w), generator=g).float()  # many equal maxima: the first one's index
    return ties, torch.randn(2, 8, h + w, generator=g), torch.randn(1, 2, 5, 7, 4, generator=g)


def test_values_and_indices_equal_eager(tmp_path):
    b, h, w, n = Dim("b", max=8), Dim("h", min=2, max=64), Dim("w", min=2, max=64), Dim("n", min=4, max=128)
    art = llmc.compile(_Pools(), _args(2, 10, 9, 0), dynamic_shapes=({0: b, 2: h, 3: w}, {2: n}, None), output=tmp_path / "amp.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "adaptive-max-pool")
    assert stats["forms"] == {"2d": 2, "3d": 1}, stats  # AdaptiveMaxPool1d reaches the pass as the 2-d op
    mod = llmc.load(art)
    for shape in ((2, 10, 9, 1), (3, 17, 6, 2)):
        args = _args(*shape)
        for i, (g, want) in enumerate(zip(mod(*args), _Pools()(*args))):
            assert g.dtype == want.dtype and g.shape == want.shape and torch.equal(g, want), (shape, i)
