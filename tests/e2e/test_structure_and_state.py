"""Call semantics (README.md, Python): output structure, folded constants, mutated buffers, f64."""

import pytest
import torch
import torch.nn as nn

import llmc
from llmc.errors import InputError


class Multi(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, x, scale: int, *, bias):
        y = self.a(x) * scale + bias
        return {"y": y, "pair": (y.sum(-1), [x.mean()])}


def test_nested_outputs_kwargs_and_folded_constants(tmp_path):
    torch.manual_seed(0)
    m = Multi().eval()
    x, b = torch.randn(2, 8), torch.randn(4)
    mod = llmc.load(llmc.compile(m, (x, 3), example_kwargs={"bias": b}, output=tmp_path / "m.vmfb"))
    got = mod(x, 3, bias=b)
    ref = m(x, 3, bias=b)
    assert set(got) == {"y", "pair"} and isinstance(got["pair"], tuple) and isinstance(got["pair"][1], list)
    torch.testing.assert_close(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["pair"][0], ref["pair"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["pair"][1][0], ref["pair"][1][0], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="folded into the module as the constant 3"):
        mod(x, 4, bias=b)


class Counter(nn.Module):
    """Mutates a buffer: torch.export functionalises it; llmc keeps it as device state, not an output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls.add_(1.0)
        return self.lin(x) + self.calls


def test_mutated_buffer_is_state_not_output(tmp_path):
    torch.manual_seed(0)
    m = Counter().eval()
    x = torch.randn(2, 4)
    art = llmc.compile(m, (x,), output=tmp_path / "c.vmfb")
    assert art.read_manifest()["params"]["mutable_state"] == ["calls"]
    mod = llmc.load(art)
    ref = Counter().eval()
    ref.load_state_dict(m.state_dict())
    ref.calls.zero_()
    for _ in range(3):
        got = mod(x)
        assert isinstance(got, torch.Tensor), "the buffer must not be mixed into the outputs"
        torch.testing.assert_close(got, ref(x), rtol=1e-5, atol=1e-6)


class F64(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.float64))

    def forward(self, x):
        return x @ self.w + 1e-12


def test_f64_is_kept(tmp_path):
    torch.manual_seed(0)
    m = F64()
    x = torch.randn(3, 8, dtype=torch.float64)
    art = llmc.compile(m, (x,), output=tmp_path / "d.vmfb")
    got = llmc.load(art)(x)
    assert got.dtype == torch.float64
    assert art.read_manifest()["f64"].startswith("kept")
    # f32 would lose the 1e-12 term and ~1e-7 of precision; f64 matches to ~1e-15.
    assert (got - m(x).detach()).abs().max().item() < 1e-12
