"""dynamic-split: `aten.split_with_sizes` with a symbolic size as one slice per piece.

Matches:  `aten.split_with_sizes(x, sizes, dim)` where some size is symbolic (chunk / split of a
          dynamic dim: torch.export writes `chunk(x, 3, 1)` of a dynamic dim as split_with_sizes
          with sizes computed from the dim). Static sizes are left as they are (NotImplemented).
Produces: `aten.slice.Tensor(x, dim, start_i, start_i + size_i)` for each piece, start_i the sum of
          the sizes before it.
Safe because: split_with_sizes is defined as those consecutive slices (each a view of x; the pieces
          are only read here, as a functional program reads them).
Why: torch-mlir 20261001 lowers split_with_sizes only for constant sizes; with symbolic ones the
          op and its integer constants reach iree-compile: "failed to legalize operation
          'torch.constant.int'" (torch-mlir's e2e ChunkListUnpackDynamic_Module,
          ChunkListUnpackUnevenDynamic_Module). Slices with symbolic bounds lower everywhere.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


@register_pass("dynamic-split")
class DynamicSplitPass(DecompositionPass):
    def decompositions(self) -> dict:
        def split_with_sizes(x, split_sizes, dim=0):
            if all(isinstance(s, int) for s in split_sizes):
                return NotImplemented
            self.rewrote_here()
            d = dim % x.dim()
            pieces, start = [], 0
            for size in split_sizes:
                pieces.append(torch.ops.aten.slice.Tensor(x, d, start, start + size))
                start = start + size
            return pieces

        return {torch.ops.aten.split_with_sizes.default: split_with_sizes}
