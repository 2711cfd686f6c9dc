"""zero-k-products, compiled and run: products over an empty inner dimension equal eager PyTorch's
(zeros, plus beta * input for addmm / baddbmm, NaN in an ignored beta=0 input included), where
iree-compile used to be killed by SIGFPE."""

import pytest
import torch

import llmc


class _Products(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(0, 5)
        with torch.no_grad():
            self.lin.bias.copy_(torch.linspace(-2, 3, 5))  # nn.Linear(0, n) initialises its bias to 0

    def forward(self, x, a, b, inp, c, d, binp, nan_inp):
        return (
            self.lin(x),  # mm + bias
            torch.bmm(a, b),
            torch.addmm(inp, c, d, beta=0.5, alpha=3.0),
            torch.baddbmm(binp, a, b, beta=-2.0),
            torch.addmm(nan_inp, c, d, beta=0.0),  # beta 0: PyTorch ignores the input, NaN and all
        )


def _args(rows: int):
    g = torch.Generator().manual_seed(rows)
    r = lambda *s: torch.randn(*s, generator=g)
    return (r(rows, 0), r(2, 4, 0), r(2, 0, 6), r(rows, 7), r(rows, 0), r(0, 7), r(2, 4, 6),
            torch.full((rows, 7), float("nan")))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model = _Products().eval()
    rows = torch.export.Dim("rows", min=1, max=64)
    dynamic = ({0: rows}, None, None, {0: rows}, {0: rows}, None, None, {0: rows})
    art = llmc.compile(model, _args(3), dynamic_shapes=dynamic, output=tmp_path_factory.mktemp("zk") / "zk.vmfb")
    return model, art


def test_every_empty_product_is_rewritten(compiled):
    _, art = compiled
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "zero-k-products")
    # linear and addmm reach the pass as mm (+ scaled adds), baddbmm as bmm: 3 mm, 2 bmm.
    assert stats["rewrote"] == 5 and stats["forms"] == {"mm": 3, "bmm": 2}, stats


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_results_equal_eager(compiled, rows):
    model, art = compiled
    args = _args(rows)
    with torch.no_grad():
        want = model(*args)
    got = llmc.load(art)(*args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert not torch.isnan(g).any(), i
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, msg=f"output {i}")
    assert got[0].abs().sum() > 0 and got[2].abs().sum() > 0  # the added terms are there, not only zeros


class _IntProducts(torch.nn.Module):
    def forward(self, a, b, c, d):
        return torch.mm(a, b), torch.bmm(c, d)


def test_integer_products_keep_their_dtype(tmp_path):
    """An int8 / int32 product over an empty K is int8 / int32 zeros, as eager's (the sums the pass
    writes would be int64 if taken as PyTorch's default integer sum)."""
    args = (torch.ones(3, 0, dtype=torch.int8), torch.ones(0, 4, dtype=torch.int8),
            torch.ones(2, 3, 0, dtype=torch.int32), torch.ones(2, 0, 5, dtype=torch.int32))
    got = llmc.load(llmc.compile(_IntProducts(), args, output=tmp_path / "zki.vmfb"))(*args)
    for g, w in zip(got, _IntProducts()(*args)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (g, w)
