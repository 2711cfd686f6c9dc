"""Field failures the dtype passes must get right, compiled for cpu and run against PyTorch.

- A Llama-style linear whose input and weight dtypes differ (eager raises; torch.export records it):
  the dtype-harmony pass widens to f32. Reference: the same linear computed in f32 from the same
  operands, cast to the dtype the program declares. f32 result within 1e-6 relative; the bf16 result
  within one bf16 rounding (2^-8 relative) of the reference.
- A spectral-norm style `torch.dot` in f16 (PyTorch once raised "dot not implemented for 'Half'"):
  sigma = u . (W v) in f16 against the same computed in f64 from the same f16 values, within 2e-3
  relative (the f16 rounding of the result and of W v); over 8192 terms the result is within the
  final f16 rounding of the f64 value, which an f16 accumulator misses by more than 1%.
"""

import pytest
import torch
import torch.nn.functional as F

import llmc


class MixedLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 64).to(torch.bfloat16))
        self.v = torch.nn.Parameter(torch.randn(16, 32) / 8)

    def forward(self, x):
        a = F.linear(x, self.w)  # f32 activation, bf16 weight
        return a, F.linear(a.to(torch.bfloat16), self.v)  # bf16 activation, f32 weight


def test_mixed_dtype_linears_compile_and_match_promotion(tmp_path):
    torch.manual_seed(0)
    m = MixedLinear()
    x = torch.randn(4, 64)
    with pytest.raises(RuntimeError):
        m(x)  # eager PyTorch cannot run it
    art = llmc.compile(m, (x,), output=tmp_path / "m.vmfb")
    a, b = llmc.load(art)(x)
    ra = F.linear(x, m.w.float())
    rb = F.linear(ra.to(torch.bfloat16).float(), m.v.detach()).to(torch.bfloat16)
    assert a.dtype == torch.float32 and b.dtype == torch.bfloat16
    assert (a - ra).abs().max() <= 1e-6 * ra.abs().max()
    assert ((b.float() - rb.float()).abs() <= 2**-8 * rb.float().abs() + 1e-6).all()
    stats = {p["name"]: p for p in art.read_manifest()["passes"]}["dtype-harmony"]
    assert stats["forms"] == {"bfloat16xfloat32->float32": 2}


class SpectralSigma(torch.nn.Module):
    def forward(self, w, u, v):
        return torch.dot(u, torch.mv(w, v))


def test_f16_dot_of_spectral_norm(tmp_path):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(128, 96, generator=g).half()
    u = F.normalize(torch.randn(128, generator=g), dim=0).half()
    v = F.normalize(torch.randn(96, generator=g), dim=0).half()
    art = llmc.compile(SpectralSigma(), (w, u, v), output=tmp_path / "s.vmfb", dump_ir=tmp_path / "ir")
    got = llmc.load(art)(w, u, v)
    want = torch.dot(u.double(), torch.mv(w.double(), v.double()))
    assert got.dtype == torch.float16
    assert abs(got.double() - want) <= 2e-3 * abs(want), (got, want)
    # The reductions accumulate in f32 (torch's own dot/mv decompositions upcast; llmc keeps them):
    imported = next((tmp_path / "ir").glob("*-import.mlir")).read_text()  # numbered after the graph passes that ran
    sums = [line for line in imported.splitlines() if "torch.aten.sum.dim_IntList" in line]
    assert len(sums) == 2 and all(line.rstrip().endswith("f32>") for line in sums), sums


def test_f16_dot_accumulates_in_f32(tmp_path):
    # 8192 positive terms near 1: a sum kept in f16 (spacing 4 at 4096..8192) would be off by far more
    # than the final f16 rounding (2^-11 relative) that an f32 accumulator leaves.
    g = torch.Generator().manual_seed(0)
    n = 8192
    w = (1 + torch.rand(n, 4, generator=g) / 8).half()
    u = (1 + torch.rand(n, generator=g) / 8).half()
    v = torch.full((4,), 0.25).half()
    art = llmc.compile(SpectralSigma(), (w, u, v), output=tmp_path / "s.vmfb")
    got = llmc.load(art)(w, u, v)
    want = torch.dot(u.double(), torch.mv(w.double(), v.double()))
    f16_sum = torch.zeros((), dtype=torch.float16)
    for t in (u * torch.mv(w, v)):  # what an f16 accumulator would give (sequential)
        f16_sum += t
    assert abs(f16_sum.double() - want) > 1e-2 * want  # the test can tell the two apart
    assert abs(got.double() - want) <= 2**-11 * want, (got, want)
