"""dynamic-split, compiled for cpu and run: chunk and split of a dynamic dim into even and uneven
pieces give eager PyTorch's pieces exactly (slices: moved, not computed) at three sizes. Before, the
symbolic split_with_sizes reached iree-compile ("failed to legalize operation 'torch.constant.int'",
torch-mlir's e2e ChunkListUnpackDynamic_Module)."""

import torch
from torch.export import Dim

import llmc


class _Split(torch.nn.Module):
    def forward(self, x):
        a, b, c = torch.chunk(x, 3, 1)
        return a, b, c, *torch.split(x, x.shape[1] // 2, dim=1)[:2]


def test_dynamic_chunks_equal_eager(tmp_path):
    ep = torch.export.export(_Split(), (torch.rand(2, 9, 4),), dynamic_shapes=({1: Dim.AUTO},))
    art = llmc.compile(ep, output=tmp_path / "s.vmfb")
    assert next(p for p in art.read_manifest()["passes"] if p["name"] == "dynamic-split")["rewrote"] >= 1
    mod = llmc.load(art)
    for n in (9, 10, 17):
        x = torch.rand(2, n, 4)
        got, want = mod(x), _Split()(x)
        assert len(got) == len(want) and all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want)), n
