"""prims-as-aten: `prims` ops a user calls directly, as the ATen ops that mean the same.

Matches:  `prims.squeeze(a, dimensions)`, `prims.view_of(a)`, `prims.split_dim(a, dim, outer)`
          (ops whose output aliases their input) and `prims.prod(a, dims, output_dtype=None)`, as
          they stand in an exported graph (a model calling `torch.ops.prims.*`; PyTorch's own
          decompositions never leave them there).
Produces: the aliasing three retargeted in place, before the program is decomposed:
          `aten.squeeze.dims(a, dimensions)`, `aten.alias(a)`, `aten.unflatten.int(a, dim,
          [outer, -1])` (the node keeps its name, so the program's signature still names it);
          prims.prod, during decomposition, as `aten.prod.dim_int` over each dim from the last,
          or a copy of `a` for no dims, in `output_dtype` when given.
Safe because: each ATen op has prims' contract: squeeze drops the listed size-1 dims (prims
          requires them to be 1, as eager checks), view_of is a view of the same values, split_dim
          turns size S at `dim` into (outer, S / outer) in row-major order (prims requires outer to
          divide S), and a product over several dims is the product of single-dim products.
          Removing dims from the last keeps the earlier dims' numbers valid.
Why: `run_decompositions` refuses a non-ATen op with an aliasing output ("Found a custom (non-ATen)
          operator whose output has alias annotations: prims::squeeze(...)", torch-mlir's e2e
          PrimsSqueezeModule, PrimsViewOfModule, SplitDimStaticModule), before any decomposition
          table entry is consulted; and torch-mlir lowers no `torch.prims.prod` ("failed to
          legalize operation 'torch.prims.prod'", PrimsProdFloatModule).
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


def _retarget(node) -> str | None:
    """Point one aliasing prims node at its ATen op; the form's name, or None if it is not one."""
    prims, aten = torch.ops.prims, torch.ops.aten
    args = node.args
    if node.target is prims.squeeze.default:
        dims = args[1] if len(args) > 1 else node.kwargs["dimensions"]
        node.target, node.args, node.kwargs = aten.squeeze.dims, (args[0], list(dims)), {}
        return "squeeze"
    if node.target is prims.view_of.default:
        node.target, node.args, node.kwargs = aten.alias.default, (args[0],), {}
        return "view_of"
    if node.target is prims.split_dim.default:
        kw = node.kwargs
        a, dim, outer = args[0], args[1] if len(args) > 1 else kw["dim"], args[2] if len(args) > 2 else kw["outer_length"]
        node.target, node.args, node.kwargs = aten.unflatten.int, (a, dim, [outer, -1]), {}
        return "split_dim"
    return None


@register_pass("prims-as-aten")
class PrimsAsAtenPass(DecompositionPass):
    def before_decomposing(self, program) -> None:
        graph = program.graph_module.graph
        changed = False
        for node in graph.nodes:
            if node.op == "call_function":
                form = _retarget(node)
                if form is not None:
                    self.stats.rewrite(form)
                    changed = True
        if changed:
            program.graph_module.recompile()

    def decompositions(self) -> dict:
        def prod(a, dims, *, output_dtype=None):
            self.rewrote_here("prod")
            out = a if output_dtype is None else a.to(output_dtype)
            dims = range(a.dim()) if dims is None else dims
            if not dims:
                return out.clone()
            for d in sorted((d % a.dim() for d in dims), reverse=True):
                out = torch.ops.aten.prod.dim_int(out, d)
            return out

        return {torch.ops.prims.prod.default: prod}
