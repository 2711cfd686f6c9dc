"""A dim torch.export specialised to a number keeps that number through import and the manifest.

With Dim.AUTO on every dim of a Linear's input, export fixes K = in_features but the placeholder's
fake tensor still holds a SymInt whose expression is 3. torch-mlir's importer typed it `?`, and IREE
3.13 then returned values 0.85 off for torch-mlir's e2e BatchMlpLayerModule (Linear(3, 5) + Tanh on
[7, 5, 3]), with no error. Now the input is typed [?, ?, 3], the manifest records 3, and the result
equals eager within f32 rounding (1e-6 absolute, tanh of values near 1) at two batch shapes."""

import pytest
import torch
from torch.export import Dim

import llmc
from llmc.errors import InputError


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh()).eval()


def test_a_specialised_dim_is_static_and_the_result_right(tmp_path):
    model = _mlp()
    ep = torch.export.export(model, (torch.rand(7, 5, 3),), dynamic_shapes=({0: Dim.AUTO, 1: Dim.AUTO, 2: Dim.AUTO},))
    k = [n for n in ep.graph.nodes if n.op == "placeholder"][-1].meta["val"].shape[2]
    assert isinstance(k, torch.SymInt), "export no longer leaves a constant SymInt: this test lost its subject"
    art = llmc.compile(ep, output=tmp_path / "mlp.vmfb", dump_ir=tmp_path / "dump")
    shape = art.read_manifest()["entry_points"]["main"]["inputs"][0]["shape"]
    assert shape[2] == 3 and isinstance(shape[0], dict) and isinstance(shape[1], dict), shape
    assert "!torch.vtensor<[?,?,3],f32>" in (tmp_path / "dump" / "05-import.mlir").read_text()
    mod = llmc.load(art)
    for b, s in ((7, 5), (2, 9)):
        x = torch.rand(b, s, 3, generator=torch.Generator().manual_seed(b))
        torch.testing.assert_close(mod(x), model(x), rtol=0, atol=1e-6)
    with pytest.raises(InputError, match=r"expected shape \[s\w*:2\.\.\d+, s\w*:2\.\.\d+, 3\], got \[7, 5, 4\]"):
        mod(torch.rand(7, 5, 4))
