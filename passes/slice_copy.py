"""slice-copy: `aten.slice_copy` -> `aten.slice` (any target).

Matches:  every `aten.slice_copy.Tensor(x, dim, start, end, step)` in the exported program.
Produces: `aten.slice.Tensor` with the same arguments.
Safe because: in value semantics (after torch.export's functionalisation nothing aliases) a slice
          and its copy hold the same values; IREE lowers both to one `tensor.extract_slice`, which
          fuses into its consumers.
Why: torch-mlir 20261001 has no lowering for `aten.slice_copy`, and llmc's Llama decode uses it to
          stop torch.export from guarding a full-length dynamic slice (`kc[:, :, :n]` guards
          n != max_seq_len, which rejects the cache's last position).
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


@register_pass("slice-copy")
class SliceCopyPass(DecompositionPass):
    def decompositions(self) -> dict:
        def slice_copy(x, dim=0, start=None, end=None, step=1):
            self.rewrote_here()
            return torch.ops.aten.slice.Tensor(x, dim, start, end, step)

        return {torch.ops.aten.slice_copy.Tensor: slice_copy}
