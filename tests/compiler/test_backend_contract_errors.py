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


def test_the_cli_reports_it_with_exit_3(tmp_path):
    from conftest import llmc_in_process

    pt2 = tmp_path / "conv_tbc.pt2"
    torch.export.save(torch.export.export(_ConvTbc(), (torch.rand(9, 4, 5), torch.rand(3, 5, 6), torch.rand(6))), pt2)
    out = tmp_path / "out"
    out.mkdir()
    r = llmc_in_process("compile", pt2, "-o", out / "c.vmfb")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("llmc: error: ")]
    assert r.returncode == 3 and len(errors) == 1, r.stderr
    assert "backend contract failed: " in errors[0] and "doesn't match function result type" in errors[0], errors
    assert "Traceback" not in r.stderr and not list(out.iterdir())

