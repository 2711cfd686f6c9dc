"""isfinite: `aten.isfinite(x)` as comparisons torch-mlir lowers.

Matches:  every `aten.isfinite` (torch-mlir has no lowering for it).
Produces: for a floating-point x, `logical_not(isnan(x)) & (abs(x) != inf)`; for integer and
          bool x, a true tensor of x's shape.
Safe because: a float is finite exactly when it is neither NaN nor of infinite magnitude; every
          integer is finite. (Not `x == x`: that is folded to true on the way to IREE, NaN or not.)
Why: iree-compile 3.13 fails with "failed to legalize operation 'torch.aten.isfinite'" (torch-mlir's
          e2e IsInfiniteModule); isnan, abs and ne lower everywhere.
"""

from __future__ import annotations

import math

import torch

from llmc.passes._base import DecompositionPass, register_pass


@register_pass("isfinite")
class IsFinitePass(DecompositionPass):
    def decompositions(self) -> dict:
        def isfinite(x):
            self.rewrote_here("float" if x.dtype.is_floating_point else "integer")
            if x.dtype.is_floating_point:
                return torch.logical_not(torch.isnan(x)) & torch.ne(torch.abs(x), math.inf)
            return torch.ones_like(x, dtype=torch.bool)

        return {torch.ops.aten.isfinite.default: isfinite}
