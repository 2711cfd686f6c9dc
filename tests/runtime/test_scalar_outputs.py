"""A program that returns Python numbers (a tensor's `.item()`, a dynamic size) gives them back as
Python ints, not as tensors and not refused. Before, llmc refused at compile: "output
_local_scalar_dense is not a tensor (SymInt)" (torch-mlir's e2e AtenSymConstrainRange)."""

import torch
from torch.export import Dim

import llmc


class _Scalars(torch.nn.Module):
    def forward(self, x, n):
        count = n.item()
        torch._check(count >= 0)
        return x * 2, count, x.shape[0]


def test_python_ints_come_back_as_ints(tmp_path):
    rows = Dim("rows", min=2, max=64)
    ep = torch.export.export(_Scalars(), (torch.rand(3, 4), torch.tensor(7)), dynamic_shapes=({0: rows}, None))
    art = llmc.compile(ep, output=tmp_path / "s.vmfb")
    outputs = art.read_manifest()["entry_points"]["main"]["outputs"]["children"]
    assert [o["type"] for o in outputs] == ["tensor", "scalar", "scalar"] and outputs[1]["python"] == "int", outputs
    mod = llmc.load(art)
    for r, n in ((3, 7), (9, 123456789012)):
        x = torch.rand(r, 4)
        got = mod(x, torch.tensor(n))
        assert torch.equal(got[0], x * 2)
        assert got[1:] == (n, r) and all(type(v) is int for v in got[1:]), got[1:]
