"""scaled-mm, compiled for cpu and run: fp8 scaled products equal eager PyTorch's `torch._scaled_mm`
(E4M3FN and E5M2, per-tensor and per-row/column scales, with and without bias, bf16 / f16 / f32
outputs) at two dynamic row counts. Tolerances: bf16 and f16 outputs bit for bit (every fp8 product
is exact in f32, and the one rounding to 8 or 11 bits hides a last-bit difference of the f32 sums
unless it sits on a rounding boundary, which none of these seeded inputs does); the f32 output
within rtol = atol = 1e-6 (the sums' order and the scale/bias order may move its last bit: measured
9.5e-7 at most)."""

import torch
from torch.export import Dim

import llmc


class _Scaled(torch.nn.Module):
    def forward(self, a, b, sa, sb, ra, rb, bias):
        return (
            torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), sa, sb, out_dtype=torch.bfloat16),
            torch._scaled_mm(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), sa, sb, out_dtype=torch.float16),
            torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), ra, rb, bias=bias, out_dtype=torch.float32),
        )


def _args(rows: int):
    g = torch.Generator().manual_seed(rows)
    r = lambda *s: torch.rand(*s, generator=g)
    return (r(rows, 32) * 4 - 2, r(32, 16) * 4 - 2, r(()), r(()), r(rows, 1), r(1, 16), r(16))


def test_scaled_products_equal_eager(tmp_path):
    rows = Dim("rows", min=1, max=64)
    art = llmc.compile(_Scaled(), _args(16), dynamic_shapes=({0: rows}, None, None, None, {0: rows}, None, None), output=tmp_path / "smm.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "scaled-mm")
    assert stats["forms"] == {"tensorwise": 2, "rowwise": 1}, stats
    mod = llmc.load(art)
    for n in (3, 16):
        args = _args(n)
        for i, (g, w) in enumerate(zip(mod(*args), _Scaled()(*args))):
            assert g.dtype == w.dtype and g.shape == w.shape, i
            if w.dtype == torch.float32:
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(g, w), (n, i, (g.float() - w.float()).abs().max())


class _BlockScaled(torch.nn.Module):
    def forward(self, a, b, sa, sb):
        return torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), sa, sb, out_dtype=torch.bfloat16)


def test_block_scaled_is_refused_with_one_line_and_no_files(tmp_path):
    """MX (e8m0) scales: `llmc compile` exits with PassError's code 3, one line naming the op and the
    scales' dtype, no traceback and nothing written."""
    from conftest import llmc_in_process, message_lines

    args = (torch.rand(3, 32), torch.rand(32, 64), torch.ones(512, dtype=torch.float8_e8m0fnu), torch.ones(512, dtype=torch.float8_e8m0fnu))
    pt2 = tmp_path / "blocked.pt2"
    torch.export.save(torch.export.export(_BlockScaled(), args), pt2)
    out = tmp_path / "out"
    out.mkdir()
    r = llmc_in_process("compile", pt2, "-o", out / "b.vmfb")
    lines = message_lines(r.stderr)
    assert r.returncode == 3 and len(lines) == 1, r.stderr
    assert "aten._scaled_mm with scale_a of torch.float8_e8m0fnu (block-scaled, MX) is not supported" in lines[0]
    assert "Traceback" not in r.stderr and list(out.iterdir()) == []
