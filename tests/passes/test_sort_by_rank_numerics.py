"""sort-by-rank, compiled for cpu and run: sorts and top-k equal eager PyTorch's exactly (values and
indices: the rewrite is the stable sort, as eager's stable sort), NaN, infinities, -0.0, ties and a
dynamic length included; and a MoE router's pattern (a sort's permutation inverted with an arange,
two same-shape top-k) comes out right, which IREE's in-place sort got wrong (iree-org/iree#24665)."""

import pytest
import torch
from torch.export import Dim

import llmc


class _Sorts(torch.nn.Module):
    def forward(self, ids, x, logits):
        ids_sorted, perm = torch.sort(ids)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.shape[0])  # transformers' inverse permutation
        up, up_i = torch.sort(x)
        down, down_i = torch.sort(x, descending=True)
        cols, cols_i = torch.sort(logits, dim=0)
        w0, e0 = torch.topk(logits, 2)  # a router per layer: two top-k of one shape (inputs exact)
        w1, e1 = torch.topk(logits * 2, 2)
        return ids_sorted, perm, inv, up, up_i, down, down_i, cols, cols_i, w0, e0, w1, e1


def _args(n: int):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 4, (n,), generator=g)  # many ties
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1.5, 1.5, float("nan")])
    x = torch.cat([torch.randn(n, generator=g), special])
    return ids, x, torch.randn(6, 4, generator=g)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    n, m = Dim("n", min=2, max=256), Dim("m", min=2, max=256)
    art = llmc.compile(_Sorts(), _args(16), dynamic_shapes=({0: n}, {0: m}, None),
                       output=tmp_path_factory.mktemp("sort") / "sorts.vmfb")
    return art, llmc.load(art)


def test_every_sort_and_topk_rewritten(compiled):
    art, _ = compiled
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "sort-by-rank")
    assert stats["forms"] == {"sort": 4, "topk": 2}, stats


def _reference(ids, x, logits):
    """What _Sorts computes with eager's stable sort (its default sort need not be stable: with ties
    the indices may differ, and any order of ties is a correct sort)."""
    with torch.no_grad():
        want = list(_Sorts()(ids, x, logits))
    perm = torch.sort(ids, stable=True)[1]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0])
    want[1], want[2] = perm, inv
    want[4] = torch.sort(x, stable=True)[1]
    want[6] = torch.sort(x, descending=True, stable=True)[1]
    want[8] = torch.sort(logits, dim=0, stable=True)[1]
    return want


@pytest.mark.parametrize("n", [2, 16, 37])
def test_equal_to_eager_stable_sort(compiled, n):
    _, mod = compiled
    args = _args(n)
    got = mod(*args)
    names = "ids_sorted perm inv up up_i down down_i cols cols_i w0 e0 w1 e1".split()
    for name, g, w in zip(names, got, _reference(*args)):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w) or (g.is_floating_point() and torch.allclose(g, w, rtol=0, atol=0, equal_nan=True)), (name, g, w)
    # -0.0 and 0.0 keep their order and sign (gathered, not computed)
    up, up_i = got[3], got[4]
    zeros = (up == 0).nonzero().flatten()
    assert torch.equal(torch.signbit(up[zeros]), torch.signbit(args[1][up_i[zeros]]))


class _Kth(torch.nn.Module):
    def forward(self, x):
        v, i = torch.kthvalue(x, 2, dim=1)
        w, j = torch.kthvalue(x, 5, dim=0, keepdim=True)
        return v, i, w, j


def test_kthvalue_equals_eager(tmp_path):
    """kthvalue (rejected by IREE 3.13 as torch-mlir lowers it) through the rank sort: values and
    indices equal eager's on distinct values, at two dynamic row counts."""
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    art = llmc.compile(_Kth(), (x,), dynamic_shapes=({0: Dim("r", min=5, max=64)},), output=tmp_path / "kth.vmfb")
    mod = llmc.load(art)
    for rows in (5, 12):
        xs = torch.randn(rows, 5, generator=torch.Generator().manual_seed(rows))  # distinct: no ties to order
        for name, g, w in zip("v i w j".split(), mod(xs), _Kth()(xs)):
            assert torch.equal(g, w), (rows, name, g, w)
