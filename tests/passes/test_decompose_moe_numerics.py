"""decompose-moe, compiled for cpu and run: histc and the grouped products of a MoE layer equal eager
PyTorch's.

Tolerances: histc counts are exact (integers). f32 grouped products: K = 32 products summed in f32,
each row against eager's own f32 mm: |error| <= K * 2^-24 * sum|x w| ~ 1e-5 here, so rtol = atol =
1e-5. bf16 `aten._grouped_mm` (eager accumulates in f32 and rounds once to bf16; the gather form
does the same, the dense form's bf16 bmm too): at most one bf16 ulp apart, <= 2^-7 of the value,
so rtol = 2^-7 (atol 1e-5 for values that round to zero).
"""

import pytest
import torch
from torch.export import Dim

import llmc
from llmc.compiler import pipeline, targets
from llmc.errors import PassError

transformers_moe = pytest.importorskip("transformers.integrations.moe")  # registers transformers::grouped_mm_fallback

E, K, N = 4, 32, 24


def _stats(art) -> dict:
    return next(p for p in art.read_manifest()["passes"] if p["name"] == "decompose-moe")


class _Fallback(torch.nn.Module):
    """The f32 path of transformers' experts: grouped_mm_fallback over offsets, plus two histograms."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(E, K, N, generator=torch.Generator().manual_seed(0)))

    def forward(self, x2, offs2, x, offs, h):
        grouped = torch.ops.transformers.grouped_mm_fallback
        return (
            grouped(x2, self.w, offs2),  # 2 rows <= 4 experts: the gather form
            grouped(x, self.w, offs),  # a dynamic number of rows: the dense form
            torch.histc(h, bins=5, min=-1.5, max=2.0),
            # expert ids as floats (NaN kept out: llmc's clamp of NaN gives 0 on cpu, eager's NaN)
            torch.histc(h.nan_to_num(0.0).round().clamp(0, E - 1), bins=E, min=0, max=E - 1),
        )


def _offsets(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def _fallback_args(rows: int, offs):
    g = torch.Generator().manual_seed(rows)
    h = torch.cat([torch.randn(3 * rows, generator=g) * 2,
                   torch.tensor([-1.5, 2.0, -0.8, -0.1, 0.6, 1.3, 2.0001, -1.5001, float("nan"), float("inf"), -float("inf")])])
    return (torch.randn(2, K, generator=g), _offsets(0, 1, 1, 2), torch.randn(rows, K, generator=g), offs, h)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    model = _Fallback().eval()
    rows, length = Dim("rows", min=2, max=64), Dim("length", min=2, max=512)
    dyn = (None, None, {0: rows}, None, {0: length})
    art = llmc.compile(model, _fallback_args(9, _offsets(2, 2, 6, 9)), dynamic_shapes=dyn,
                       output=tmp_path_factory.mktemp("moe") / "fallback.vmfb")
    return model, art, llmc.load(art)


def test_fallback_rewritten(fallback):
    _, art, _ = fallback
    assert _stats(art)["forms"] == {"dense": 1, "gather": 1, "histc": 2}, _stats(art)


@pytest.mark.parametrize("rows, offs", [
    (9, _offsets(2, 2, 6, 9)),  # an empty group
    (5, _offsets(0, 0, 0, 5)),  # every row in the last expert
    (17, _offsets(4, 8, 12, 13)),  # rows past the last offset: zero in both
])
def test_fallback_equals_eager(fallback, rows, offs):
    model, _, mod = fallback
    args = _fallback_args(rows, offs)
    with torch.no_grad():
        want = model(*args)
    got = mod(*args)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg="gather form")
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, msg="dense form")
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    assert torch.equal(got[3], want[3]), (got[3], want[3])
    # The comparison can tell experts apart: the rows under another expert's weights are far off.
    shifted = model.w.detach().roll(1, 0)
    wrong = torch.ops.transformers.grouped_mm_fallback(args[2], shifted, offs)
    assert (wrong - got[1])[: int(offs[-1])].abs().max() > 1.0


class _GroupedBf16(torch.nn.Module):
    """torch._grouped_mm as transformers calls it for bf16 weights ([E, N, K] stored, used transposed)."""

    def __init__(self):
        super().__init__()
        w = torch.randn(E, N, K, generator=torch.Generator().manual_seed(1))
        self.w = torch.nn.Parameter(w.to(torch.bfloat16))

    def forward(self, x2, offs2, x, offs):
        wt = self.w.transpose(-2, -1)
        return torch._grouped_mm(x2, wt, offs2), torch._grouped_mm(x, wt, offs)


def _bf16_args(offs):
    g = torch.Generator().manual_seed(int(offs[-1]))
    bf = torch.bfloat16
    return (torch.randn(3, K, generator=g).to(bf), _offsets(1, 1, 3, 3), torch.randn(10, K, generator=g).to(bf), offs)


@pytest.fixture(scope="module")
def grouped_bf16(tmp_path_factory):
    model = _GroupedBf16().eval()
    ep = torch.export.export(model, _bf16_args(_offsets(3, 3, 7, 10)))
    art = llmc.compile(ep, output=tmp_path_factory.mktemp("moe") / "grouped.vmfb")  # computed in bf16 as exported
    return model, art, llmc.load(art)


@pytest.mark.parametrize("offs", [_offsets(3, 3, 7, 10), _offsets(1, 4, 5, 8)])
def test_grouped_mm_bf16_equals_eager(grouped_bf16, offs):
    model, art, mod = grouped_bf16
    assert _stats(art)["forms"] == {"dense": 1, "gather": 1}, _stats(art)
    args = _bf16_args(offs)
    with torch.no_grad():
        want = model(*args)
    got = mod(*args)
    assert got[0].dtype == got[1].dtype == torch.bfloat16
    # eager leaves rows past the last offset uninitialized: compare the grouped rows only
    torch.testing.assert_close(got[0][:3].float(), want[0][:3].float(), rtol=2**-7, atol=1e-5, msg="gather form")
    end = int(offs[-1])
    torch.testing.assert_close(got[1][:end].float(), want[1][:end].float(), rtol=2**-7, atol=1e-5, msg="dense form")
    assert not got[1][end:].any()  # and they are zero here, as transformers' fallback returns them


def test_unsupported_grouping_is_refused_in_one_line():
    class GroupsAlongK(torch.nn.Module):
        def forward(self, a, b, offs):
            return torch._grouped_mm(a, b, offs)

    bf = torch.bfloat16
    ep = torch.export.export(GroupsAlongK(), (torch.randn(8, 16, dtype=bf), torch.randn(16, 8, dtype=bf), _offsets(4, 8, 12, 16)))
    with pytest.raises(PassError) as e:
        pipeline.run_graph(pipeline.build(targets.resolve("cpu", None, "f32")), ep)
    msg = str(e.value)
    assert "decompose-moe: aten._grouped_mm of 2-d x 2-d operands with offsets is not supported" in msg, msg
    assert "\n" not in msg, msg
