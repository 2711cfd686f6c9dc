"""narrow-int-products, compiled for cpu and run: int8, uint8 and int16 mm / bmm / matmul whose sums
overflow the narrow type equal eager PyTorch's wrapped results exactly, static and dynamic. Before,
iree-compile was killed by SIGSEGV on the int8 mm ("dstOriginalDtype has to be passed to
convertScalarToDtype", torch-mlir's e2e AtenMmInt8Types)."""

import torch
from torch.export import Dim

import llmc


class _Products(torch.nn.Module):
    def forward(self, a, b, c, d, e, f):
        return torch.mm(a, b), torch.bmm(c, d), torch.matmul(e, f)


def _args(m: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    i8 = lambda *s: torch.randint(-128, 128, s, generator=g, dtype=torch.int8)
    u8 = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.uint8)
    i16 = lambda *s: torch.randint(-32768, 32768, s, generator=g, dtype=torch.int16)
    return i8(m, 16), i8(16, 8), u8(2, m, 9), u8(2, 9, 5), i16(m, 12), i16(12, 3)


def test_narrow_integer_products_wrap_as_eager(tmp_path):
    m = Dim("m", min=2, max=64)
    art = llmc.compile(_Products(), _args(4, 0), dynamic_shapes=({0: m}, None, {1: m}, None, {0: m}, None), output=tmp_path / "p.vmfb")
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "narrow-int-products")
    assert stats["forms"] == {"int16": 1, "int8": 1, "uint8": 1}, stats
    mod = llmc.load(art)
    for rows in (4, 13):
        args = _args(rows, rows)
        want = _Products()(*args)
        exact = (torch.mm(args[0].int(), args[1].int()), torch.bmm(args[2].int(), args[3].int()), torch.matmul(args[4].int(), args[5].int()))
        assert all(not torch.equal(x, w.int()) for x, w in zip(exact, want))  # every product wrapped somewhere
        for i, (g, w) in enumerate(zip(mod(*args), want)):
            assert g.dtype == w.dtype and torch.equal(g, w), (rows, i)
