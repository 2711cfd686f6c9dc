"""narrow-int-products: a matrix product of 8- or 16-bit integers computed in int32, then wrapped.

Matches:  `aten.mm` and `aten.bmm` whose result is int8, uint8 or int16 (PyTorch multiplies and
          sums in the operands' own type there: `torch.mm` of two int8 matrices is int8, wrapping
          around on overflow). matmul, linear and addmm reach the graph passes as these.
Produces: both operands converted to int32 (`aten._to_copy`, sign- or zero-extending as their type
          says), an int32 `mm` / `bmm`, and the result converted back to the original type.
Safe because: converting int32 to an 8- or 16-bit type keeps the low bits, i.e. reduces modulo
          2^8 or 2^16, and reduction modulo 2^n commutes with sums and products: the low bits of
          the int32 dot product are those of the same dot product accumulated with wraparound in
          the narrow type, as eager does. The int32 sum cannot overflow into a different low part
          either, since int32 wraps modulo 2^32, a multiple of 2^8 and 2^16.
Why: torch-mlir 20261001 lowers an int8 `mm` with an int8 accumulator by converting a scalar to
          the byte type without the original dtype, and iree-compile 3.13 is killed by SIGSEGV
          after "unimplemented: for conversion to byte or char type dstOriginalDtype has to be
          passed to convertScalarToDtype" (torch-mlir's e2e AtenMmInt8Types_basic). Int32
          products lower everywhere (and are what IREE's integer kernels compute anyway).
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, fill_fake_values, register_pass

_aten = torch.ops.aten
_PRODUCTS = (_aten.mm.default, _aten.bmm.default)
_NARROW = (torch.int8, torch.uint8, torch.int16)


def _narrow_dtype(node: torch.fx.Node):
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) and val.dtype in _NARROW else None


@register_pass("narrow-int-products")
class NarrowIntProductsPass(GraphPass):
    def applies(self, program) -> bool:
        return any(n.op == "call_function" and n.target in _PRODUCTS and _narrow_dtype(n) for n in program.graph.nodes)

    def run(self, program):
        graph = program.graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _PRODUCTS:
                continue
            dtype = _narrow_dtype(node)
            if dtype is None:
                continue
            with graph.inserting_before(node):
                a, b = (graph.call_function(_aten._to_copy.default, (x,), {"dtype": torch.int32}) for x in node.args[:2])
                wide = graph.call_function(node.target, (a, b))
                out = graph.call_function(_aten._to_copy.default, (wide,), {"dtype": dtype})
            _packed.replace(graph, node, out, program.graph_signature.output_specs)
            self.stats.rewrite(str(dtype).removeprefix("torch."))
        fill_fake_values(graph)
        graph.lint()
        program.graph_module.recompile()
        return program
