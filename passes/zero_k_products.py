"""zero-k-products: a matrix product over an empty inner dimension becomes sums of its operands.

Matches:  `aten.mm` and `aten.bmm` whose inner dimension K is statically 0: A [.., M, 0] times
          B [.., 0, N], e.g. `nn.Linear(0, N)` or a product with an empty slice. (linear, matmul,
          addmm and baddbmm reach the graph passes as these: the decomposition table llmc exports
          with writes addmm as mm, a multiply by alpha and an add of beta * input.)
Produces: sum(A, -1, keepdim) * sum(B, -2, keepdim): [.., M, 1] * [.., 1, N] -> [.., M, N], the
          sums taken in the product's dtype (PyTorch's sum of an integer tensor is int64; an int8
          product is int8).
Safe because: a sum over zero elements is exactly 0, so the result is exactly the zero [.., M, N]
          tensor the product is, and no element of A or B is read (none is: K = 0), as none is by
          the empty product. The shapes follow A and B, so a dynamic M or N stays dynamic; the
          decomposed addmm's `beta * input` and `alpha *` stay as they were.
Why: IREE 3.13's llvm-cpu backend is killed by SIGFPE compiling a matmul with K = 0 (a division by
          the zero reduction size; llmc reported "iree-compile was killed by SIGFPE for target
          'cpu'" for `torch.mm` of [4, 0] x [0, 5], `nn.Linear(0, 5)` and `torch.bmm` of
          [2, 4, 0] x [2, 0, 5]). The sums and the broadcast product compile on every target.
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, fill_fake_values, register_pass

_aten = torch.ops.aten
_PRODUCTS = (_aten.mm.default, _aten.bmm.default)


def _inner_is_zero(node: torch.fx.Node) -> bool:
    a = node.args[0]
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return False
    k = val.shape[-1]
    return isinstance(k, int) and k == 0  # a symbolic K is left alone: it may be nonzero at run time


@register_pass("zero-k-products", Requires())
class ZeroKProductsPass(GraphPass):
    def run(self, program):
        graph = program.graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _PRODUCTS or not _inner_is_zero(node):
                continue
            dtype = node.meta["val"].dtype  # the product's: a plain sum of int8 would widen to int64
            with graph.inserting_before(node):
                sa = graph.call_function(_aten.sum.dim_IntList, (node.args[0], [-1], True), {"dtype": dtype})
                sb = graph.call_function(_aten.sum.dim_IntList, (node.args[1], [-2], True), {"dtype": dtype})
                out = graph.call_function(_aten.mul.Tensor, (sa, sb))
            _packed.replace(graph, node, out, program.graph_signature.output_specs)
            self.stats.rewrite(str(node.target).split(".")[-2])
        fill_fake_values(graph)  # once, for every node added above
        graph.lint()
        program.graph_module.recompile()
        return program
