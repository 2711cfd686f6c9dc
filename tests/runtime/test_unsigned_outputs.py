"""uint8 results come back as uint8 with eager's values: IREE's integers are signless, so a uint8
result arrives as int8 holding the same bits, and the runtime relabels it from the manifest's output
dtype (torch-mlir's e2e ReduceMaxAlongDimUnsignedInt and ElementwiseToDtypeI64ToUI8 came back int8).
Values from 0 to 255, so an int8 reading (or a signed max / min) would differ."""

import torch

import llmc


class _Unsigned(torch.nn.Module):
    def forward(self, x, y):
        values, index = torch.max(x, dim=1)
        return values, index, torch.amin(x, dim=0), y.to(torch.uint8), x + 100


def test_uint8_results_are_uint8_and_equal_eager(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (4, 6), dtype=torch.uint8, generator=g)
    x[0, 0], x[1, 1] = 255, 128  # above int8's range for sure
    y = torch.randint(0, 250, (5,), generator=g)
    got = llmc.load(llmc.compile(_Unsigned(), (x, y), output=tmp_path / "u8.vmfb"))(x, y)
    for i, (a, b) in enumerate(zip(got, _Unsigned()(x, y))):
        assert a.dtype == b.dtype and torch.equal(a, b), (i, a, b)
