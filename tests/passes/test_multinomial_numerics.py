"""multinomial, compiled for cpu and run: the draws follow the weights. Not eager's draws (another
random generator), so the check is statistical: with replacement, 200,000 draws from weights
[0, 1, 2, 3, 0, 4] (1-d and a 2-d row): every category's frequency within 5 standard deviations of
w_i / W (a false failure about 1 in 10^6 per category), the zero-weight ones never drawn; without
replacement: 3 distinct categories per row, never a zero-weight one, and over 20,000 rows the first
draw's frequencies again within 5 standard deviations of w_i / W."""

import torch

import llmc

W = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0, 4.0])


class _Draw(torch.nn.Module):
    def forward(self, p, rows):
        return torch.multinomial(p, 200_000, replacement=True), torch.multinomial(rows, 3, replacement=False)


def _within(draws: torch.Tensor, weights: torch.Tensor):
    n = draws.numel()
    freq = torch.bincount(draws.flatten(), minlength=len(weights)).double() / n
    p = (weights / weights.sum()).double()
    sigma = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * sigma + 1e-12).all(), (freq, p)


def test_draws_follow_the_weights(tmp_path):
    rows = W.repeat(20_000, 1)
    art = llmc.compile(_Draw(), (W, rows), output=tmp_path / "m.vmfb")
    assert next(p for p in art.read_manifest()["passes"] if p["name"] == "multinomial")["forms"] == {"no-replacement": 1, "replacement": 1}
    with_r, without = llmc.load(art)(W, rows)
    assert with_r.dtype == torch.int64 and with_r.shape == (200_000,) and without.shape == (20_000, 3)
    _within(with_r, W)
    assert not ((without == 0) | (without == 4)).any()
    assert (without[:, 0] != without[:, 1]).all() and (without[:, 0] != without[:, 2]).all() and (without[:, 1] != without[:, 2]).all()
    _within(without[:, 0], W)
