"""retarget-casts: drop the dtype pins of an f32-exported graph before llmc re-exports it in another dtype.

Runs on: the graph of a user's ExportedProgram (.pt2) compiled with --dtype f16/bf16, before the
          weights are converted and the program re-exported (compiler/export.py).
Matches:  `aten._assert_tensor_metadata` (torch.export's dtype/shape pins) and `aten.to.dtype` /
          `aten._to_copy` whose input is already f32 and whose target dtype is f32: casts that were
          no-ops in the f32 graph (`x.float()`, `x.to(x.dtype)`).
Produces: the asserts removed; each matched cast replaced by its input.
Safe because: the graph cannot tell an upcast for precision from a cast back to the input dtype
          (both are f32 -> f32 once exported in f32), so keeping them would hand f32 activations to
          bf16 matmuls and fail the asserts ("Tensor dtype mismatch! Expected: torch.float32").
          Without them the graph computes in the new dtype throughout (norms included, where the
          source model may have upcast to f32). Casts to other dtypes (int, bool) stay. For exact
          source semantics, pass the nn.Module to llmc.compile: it converts before exporting.
"""

from __future__ import annotations

import torch

from llmc.passes._base import Requires, SourcePass, register_pass


@register_pass("retarget-casts", Requires(dtypes=("f16", "bf16", "fp8", "int8")))
class RetargetCastsPass(SourcePass):
    def run(self, gm) -> None:
        changed = False
        for n in list(gm.graph.nodes):
            if n.op != "call_function":
                continue
            if n.target is torch.ops.aten._assert_tensor_metadata.default:
                gm.graph.erase_node(n)
                self.stats.rewrite()
                changed = True
            elif n.target in (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default):
                want = n.args[1] if n.target is torch.ops.aten.to.dtype and len(n.args) > 1 else n.kwargs.get("dtype")
                src = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
                if isinstance(src, torch.Tensor) and src.dtype == want and want == torch.float32:
                    n.replace_all_uses_with(n.args[0])
                    gm.graph.erase_node(n)
                    self.stats.rewrite()
                    changed = True
                else:
                    self.stats.decline(n.name, "not an f32 -> f32 cast")
        if changed:
            gm.recompile()
