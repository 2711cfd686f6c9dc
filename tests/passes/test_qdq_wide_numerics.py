"""qdq-wide-float, compiled for cpu and run: an int8 conv whose bias is int32-quantized and whose result
is quantized to int32 (torch-mlir's e2e Conv2dQInt8Module, refused before: llmc took 8-bit Q/DQ only),
and an int16 dequantize -> relu -> int16 quantize, static and dynamic, against eager PyTorch's
reference kernels. Each quantized result is the rounding of an f32 value IREE computes in another
order (an integer conv, fused multiplies), so it may differ by one where that value sits within an
ulp of a .5 boundary: at most 1, in under 1% of the elements (scales chosen so that no value lands on
a boundary exactly: 0.0031 / 0.0017, not 0.003 / 0.002 whose ratio 1.5 puts half of them there)."""

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401
from torch.export import Dim

import llmc

qd = torch.ops.quantized_decomposed


class _QConv(torch.nn.Module):
    def forward(self, x, w, b, h):
        x = qd.dequantize_per_tensor(x, 0.01, 7, -128, 127, torch.int8)
        w = qd.dequantize_per_tensor(w, 0.01, 3, -128, 127, torch.int8)
        b = qd.dequantize_per_tensor(b, 1.0, 0, -1000, 1000, torch.int32)
        conv = qd.quantize_per_tensor(torch.nn.functional.conv2d(x, w, b), 1.0, 0, -(2**31), 2**31 - 1, torch.int32)
        h = torch.relu(qd.dequantize_per_tensor(h, 0.0031, -5, -32768, 32767, torch.int16))
        return conv, qd.quantize_per_tensor(h, 0.0017, 11, -32768, 32767, torch.int16)


def _args(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-128, 127, (1, 3, n, n), generator=g, dtype=torch.int8), torch.randint(-128, 127, (4, 3, 3, 3), generator=g, dtype=torch.int8),
            torch.randint(-1000, 1000, (4,), generator=g, dtype=torch.int32), torch.randint(-32768, 32767, (n, 5), generator=g, dtype=torch.int16))


def test_wide_qdq_matches_eager(tmp_path):
    n = Dim("n", min=4, max=32)
    art = llmc.compile(_QConv(), _args(8, 0), dynamic_shapes=({2: n, 3: n}, None, None, {0: n}), output=tmp_path / "q.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "qdq-wide-float")
    assert stats["forms"] == {"dequantize per tensor": 2, "quantize per tensor": 2}, stats
    mod = llmc.load(art)
    for size in (8, 13):
        args = _args(size, size)
        (conv, h), (want_conv, want_h) = mod(*args), _QConv()(*args)
        assert conv.dtype == torch.int32 and h.dtype == torch.int16 and conv.shape == want_conv.shape
        off = (conv.long() - want_conv.long()).abs()
        assert off.max() <= 1 and (off > 0).float().mean() < 0.01, (size, off.max(), (off > 0).sum())
        off = (h.int() - want_h.int()).abs()
        assert off.max() <= 1 and (off > 0).float().mean() < 0.01, (size, off.max(), (off > 0).sum())
