"""A model that writes into its own input (`x.zero_()`, `x.index_put_(...)`) returns what eager returns,
integer inputs included, and leaves the caller's tensor as it was.

IREE 3.13 could not compile the mutable-argument form torch-mlir imports such writes as when the input
is an integer tensor ("failed to legalize unresolved target materialization from ('tensor<?x?xsi64>')
to ('tensor<?x?xi64>')", torch-mlir's e2e ZeroInt64Module, IndexPutImpl1DIntAccumulateModule); llmc
drops the write-back (compiler/importer._drop_input_mutations): the module's calling convention copies
inputs, so the caller never saw it. Integer results exact; f32 results exact too (sums of small
integers)."""

import pytest
import torch
from torch.export import Dim

import llmc
from llmc.errors import CompileError


class _Writes(torch.nn.Module):
    def forward(self, z, acc, idx, vals, f):
        z.zero_()
        acc.index_put_((idx,), vals, accumulate=True)
        f.index_put_((idx,), vals.float(), accumulate=False)
        return z + 1, acc * 2, f


def _args(n: int, m: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (m,), generator=g)
    return (torch.randint(-9, 9, (n, 3), generator=g), torch.randint(-9, 9, (n,), generator=g), idx,
            torch.randint(-9, 9, (m,), generator=g), torch.zeros(n))


def test_writes_into_inputs_match_eager_and_leave_the_callers_tensors(tmp_path):
    n, m = Dim("n", min=2, max=64), Dim("m", min=1, max=64)
    ep = torch.export.export(_Writes(), _args(8, 5, 0), dynamic_shapes=({0: n}, {0: n}, {0: m}, {0: m}, {0: n}))
    mod = llmc.load(llmc.compile(ep, output=tmp_path / "w.vmfb"))
    for shape in ((8, 5, 1), (13, 2, 2)):
        args = _args(*shape)
        before = [a.clone() for a in args]
        got = mod(*args)
        want = _Writes()(*[a.clone() for a in args])
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and torch.equal(g, w), (shape, i, g, w)
        assert all(torch.equal(a, b) for a, b in zip(args, before))


class _ArangeOut(torch.nn.Module):
    def forward(self, x):
        return torch.arange(start=1, end=13, out=x)


def test_an_out_tensor_of_another_shape_is_refused(tmp_path):
    """Eager fills the [3, 4] x with 1..12 and returns it as [3, 4]; the decomposed program returns
    [12] (torch-mlir's e2e ArangeStartOutViewModule): refused with one line, nothing written."""
    x = torch.zeros(3, 4, dtype=torch.int64)
    assert _ArangeOut()(x.clone()).shape == (3, 4)
    with pytest.raises(CompileError) as ei:
        llmc.compile(_ArangeOut(), (x,), output=tmp_path / "a.vmfb")
    msg = str(ei.value)
    assert "writes a [12] result into its input 'x' of shape [3, 4]" in msg and "\n" not in msg, msg
    assert not list(tmp_path.iterdir())


def test_the_cli_refuses_it_with_exit_3_and_one_line(tmp_path):
    from conftest import llmc_in_process, message_lines

    pt2 = tmp_path / "arange_out.pt2"
    torch.export.save(torch.export.export(_ArangeOut(), (torch.zeros(3, 4, dtype=torch.int64),)), pt2)
    out = tmp_path / "out"
    out.mkdir()
    r = llmc_in_process("compile", pt2, "-o", out / "a.vmfb")
    lines = message_lines(r.stderr)
    assert r.returncode == 3 and len(lines) == 1, r.stderr
    assert lines[0].startswith("llmc: error: ") and "into its input 'x' of shape [3, 4]" in lines[0], lines
    assert "Traceback" not in r.stderr and not list(out.iterdir())

