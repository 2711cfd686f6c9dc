"""avg-pool-forms, compiled for cpu and run against eager PyTorch: unbatched 2-d and 3-d average
pooling, and ceil_mode with count_include_pad=False over several kernel / stride / padding mixes
(windows overhanging the input by one to several elements; static: ceil mode's output size puts
guards on a dynamic size that export refuses), the unbatched ones with dynamic spatial sizes run at
two sizes. Tolerance 1e-6 relative (f32 window sums, possibly in another order)."""

import torch
import torch.nn.functional as F
from torch.export import Dim

import llmc


class _Pools(torch.nn.Module):
    def forward(self, x, y, z):
        return (F.avg_pool2d(x, [6, 8], [2, 2]), F.avg_pool3d(z, 2),
                F.avg_pool2d(y, [3, 2], [2, 3], ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(y, [2, 4], [3, 2], [1, 2], ceil_mode=True, count_include_pad=False))


def _args(h: int, w: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(4, h + 8, w + 8, generator=g), torch.rand(2, 3, 11, 12, generator=g), torch.rand(3, 4, h, w, generator=g)


def test_avg_pool_forms_match_eager(tmp_path):
    h, w = Dim("h", min=4, max=32), Dim("w", min=4, max=32)
    art = llmc.compile(_Pools(), _args(12, 12, 0), dynamic_shapes=({1: h + 8, 2: w + 8}, None, {2: h, 3: w}), output=tmp_path / "p.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "avg-pool-forms")
    assert stats["forms"] == {"ceil-exclude-pad": 3, "unbatched": 2}, stats
    mod = llmc.load(art)
    for size in ((12, 12), (6, 16)):
        args = _args(*size, seed=size[0])
        for i, (got, want) in enumerate(zip(mod(*args), _Pools()(*args))):
            assert got.shape == want.shape, (size, i, got.shape, want.shape)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
