"""adaptive-max-pool: `aten.adaptive_max_pool{2,3}d` as window gathers and maxima, one axis at a time.

Matches:  `aten.adaptive_max_pool2d(x, output_size)` and `aten.adaptive_max_pool3d` (values and
          indices; `nn.AdaptiveMaxPool1d` reaches the graph as the 2-D op), any input size, output
          smaller or larger than the input, sizes static or dynamic.
Produces, for each pooled axis from the last to the first (In elements, Out bins, o a bin):
          start[o] = floor(o * In / Out),  end[o] = ceil((o + 1) * In / Out)   (PyTorch's bins)
          window[o, l] = min(start[o] + l, end[o] - 1) for l < In // Out + 2   (>= every bin's
          length; a shorter bin repeats its last element, which changes no maximum)
          values, which = max over l of x gathered at window[o, :]   (torch.max: first maximum)
          index along the axis = window[o, which]; the flat index (h * W + w, as PyTorch's) is this
          axis' index times the sizes after it plus the later axes' index taken from the same
          window position.
Safe because: max over a box is max over its rows of the rows' maxima, so pooling one axis after
          the other gives the same values; taking the first maximum on each axis in turn gives the
          first maximum in row-major order, the element PyTorch's kernel keeps (it replaces its
          maximum only on a strictly greater value). Values are gathered, never computed. A window
          holding NaN gives NaN, as eager; its index then is the first NaN's where PyTorch's kernel
          keeps the last one.
Why: torch-mlir lowers adaptive max pooling to a pooling op with a loop dimension IREE 3.13
          rejects ("unexpected loop dimension for convolution op", torch-mlir's e2e
          AdaptiveMaxPool2dStatic_basic); gathers, comparisons and reductions lower everywhere.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


def _windows(n_in, n_out: int, device):
    """[Out, L] input positions of each bin (L bounds every bin's length; short bins repeat their end)."""
    o = torch.arange(n_out, device=device)
    start = torch.div(o * n_in, n_out, rounding_mode="floor")
    end = torch.div((o + 1) * n_in + n_out - 1, n_out, rounding_mode="floor")
    l = torch.arange(n_in // n_out + 2, device=device)
    return torch.minimum(start.unsqueeze(1) + l.unsqueeze(0), (end - 1).unsqueeze(1))


def adaptive_max_pool(x: torch.Tensor, output_size) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, flat indices) of adaptive max pooling over the last len(output_size) axes of x."""
    k = len(output_size)
    sizes = list(x.shape[x.dim() - k:])
    values, flat, after = x, None, 1
    for j in reversed(range(k)):
        axis = x.dim() - k + j
        win = _windows(sizes[j], int(output_size[j]), x.device)  # [Out, L]
        n_out, n_win = win.shape
        flat_win = win.flatten()
        gathered = values.index_select(axis, flat_win).unflatten(axis, (n_out, n_win))
        values, which = gathered.max(dim=axis + 1)  # [.., Out, ..]: first maximum of each window
        bins = torch.arange(n_out, device=x.device).reshape([n_out if d == axis else 1 for d in range(which.dim())])
        at = bins * n_win + which  # into flat_win
        pos = flat_win.index_select(0, at.flatten()).reshape(at.shape)  # the position along this axis
        if flat is None:
            flat = pos
        else:
            later = flat.index_select(axis, flat_win).unflatten(axis, (n_out, n_win))
            flat = pos * after + torch.gather(later, axis + 1, which.unsqueeze(axis + 1)).squeeze(axis + 1)
        after = after * sizes[j]
    return values, flat


@register_pass("adaptive-max-pool")
class AdaptiveMaxPoolPass(DecompositionPass):
    def decompositions(self) -> dict:
        def pooling(form: str):
            def decomposed(x, output_size):
                self.rewrote_here(form)
                return adaptive_max_pool(x, output_size)

            return decomposed

        return {torch.ops.aten.adaptive_max_pool2d.default: pooling("2d"), torch.ops.aten.adaptive_max_pool3d.default: pooling("3d")}
