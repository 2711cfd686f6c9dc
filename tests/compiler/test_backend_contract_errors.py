"""When torch-mlir's lowering to its backend contract fails, llmc's error names torch-mlir's first
diagnostic (its own message says only "Failure while executing pass pipeline").

The case pinned here is an upstream bug in torch-mlir 20261001: its decomposition of `aten.conv_tbc`
returns a [6, 7, 4] tensor where the function's result type, from torch.export, is [7, 4, 6]
(torch-mlir's e2e ConvTbcModule)."""

import pytest
import torch

import llmc
from llmc.errors import CompileError


class _ConvTbc(torch.nn.Module):
    def forward(self, x, weight, bias):
        return torch.conv_tbc(x, weight, bias, 0)


def test_a_backend_contract_failure_names_the_diagnostic(tmp_path):
    args = (torch.rand(9, 4, 5), torch.rand(3, 5, 6), torch.rand(6))
    assert _ConvTbc()(*args).shape == (7, 4, 6)
    with pytest.raises(CompileError) as ei:
        llmc.compile(_ConvTbc(), args, output=tmp_path / "c.vmfb")
    first = str(ei.value).splitlines()[0]
    assert first.startswith("torch-mlir lowering to the torch backend contract failed: "), first
    assert "doesn't match function result type ('!torch.vtensor<[7,4,6],f32>')" in first, first
    assert not list(tmp_path.iterdir())
