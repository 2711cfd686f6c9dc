"""multinomial: `aten.multinomial` as inverse-CDF sampling (with replacement) or Gumbel top-k
(without), from uniform random numbers.

Matches:  every `aten.multinomial(probs, num_samples, replacement, generator=None)` on a 1-d or 2-d
          float tensor of non-negative weights.
Produces: with replacement: u = rand(rows, num_samples) * total weight of the row; the sample is
          the number of entries of the row's inclusive cumulative sum that are <= u (a count of
          comparisons: [rows, num_samples, categories] fused into one reduction), clamped to the
          last category with a nonzero weight; without replacement: the indices of the
          num_samples largest keys log(w) - log(-log(u)) (u uniform in (0, 1)): the Gumbel top-k.
Safe because: for u uniform on [0, W), P(count = i) = w_i / W, the multinomial's distribution
          (a category of weight 0 is never drawn: its CDF step is empty); the Gumbel top-k draws
          without replacement with exactly the sequential probabilities multinomial uses. The draws
          are not eager's draws (another generator): only the distribution is the same, as between
          any two PyTorch devices.
Why: torch-mlir lowers multinomial to a loop IREE 3.13 cannot compile with a dynamic shape
          ("'tensor.dim' op unexpected during shape cleanup; dynamic dimensions must have been
          resolved prior to leaving the flow dialect", torch-mlir's e2e MultinomialModule2D), and
          its static form ran past 180 s for a million draws (MultinomialModule).
Cost: rows * num_samples * categories comparisons (a million draws from 100 categories: 1e8, one
          fused reduction); without replacement, the top-k of the sort-by-rank pass.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


def sample_multinomial(probs: torch.Tensor, num_samples: int, replacement: bool = False) -> torch.Tensor:
    squeeze = probs.dim() == 1
    w = (probs.unsqueeze(0) if squeeze else probs).to(torch.float32 if probs.dtype != torch.float64 else torch.float64)
    rows, n = w.shape
    if replacement:
        cdf = torch.cumsum(w, -1)  # [rows, n]
        u = torch.rand(rows, num_samples, dtype=w.dtype, device=w.device) * cdf[:, -1:]
        drawn = (cdf.unsqueeze(1) <= u.unsqueeze(-1)).sum(-1)  # [rows, num_samples]
        positions = torch.arange(n, device=w.device).expand(rows, n)
        last = torch.where(w > 0, positions, torch.zeros_like(positions)).amax(-1, keepdim=True)  # the last nonzero weight
        drawn = torch.minimum(drawn, last)
    else:
        u = torch.rand(rows, n, dtype=w.dtype, device=w.device).clamp_min(torch.finfo(w.dtype).tiny)
        keys = torch.log(w) - torch.log(-torch.log(u))
        drawn = torch.topk(keys, num_samples, -1).indices
    drawn = drawn.to(torch.int64)
    return drawn.squeeze(0) if squeeze else drawn


@register_pass("multinomial")
class MultinomialPass(DecompositionPass):
    def decompositions(self) -> dict:
        def multinomial(probs, num_samples, replacement=False, *, generator=None):
            self.rewrote_here("replacement" if replacement else "no-replacement")
            return sample_multinomial(probs, num_samples, replacement)

        return {torch.ops.aten.multinomial.default: multinomial}
