"""dtype-harmony: a matrix product whose operands have different float dtypes gets explicit casts.

Matches:  `aten.mm`, `aten.addmm` and `aten.baddbmm` (what linear and matmul decompose to) whose
          floating operands differ in dtype, e.g. an f32 activation against a bf16 weight, as
          torch.export records `F.linear(x_f32, w_bf16)` (its fake tensors do not check dtypes;
          eager PyTorch raises "expected m1 and m2 to have the same dtype" or, through oneDNN,
          "could not create a primitive descriptor for an inner product forward propagation
          primitive").
Produces: every floating operand cast to the promoted dtype (torch.promote_types: f32 whenever one
          operand is f32, and for f16 with bf16), the product in that dtype (IREE accumulates f32
          in f32), and the result cast back to the dtype the exported program declares for the
          op (the first operand's, as PyTorch's meta functions say).
Safe because: widening a float is exact, so the product is the exact operands' product computed
          with at least the precision of either dtype; only the final cast rounds, to the dtype the
          rest of the program already expects.
Why: torch-mlir rejects a mixed-dtype `aten.mm` before IREE sees it.
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, Requires, register_pass

_aten = torch.ops.aten
_PRODUCTS = {_aten.mm.default: (0, 1), _aten.addmm.default: (0, 1, 2), _aten.baddbmm.default: (0, 1, 2)}


def _dtype(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


@register_pass("dtype-harmony", Requires())
class DtypeHarmonyPass(GraphPass):
    def run(self, program):
        graph = program.graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _PRODUCTS:
                continue
            operands = [node.args[i] for i in _PRODUCTS[node.target] if i < len(node.args)]
            kinds = {_dtype(a) for a in operands if isinstance(a, torch.fx.Node)}
            kinds.discard(None)
            if len(kinds) < 2:
                continue
            if not all(k.is_floating_point for k in kinds):
                self.stats.decline(node.name, f"non-float operands {sorted(map(str, kinds))}")
                continue
            common = kinds.pop()
            for k in kinds:
                common = torch.promote_types(common, k)
            out = _dtype(node)
            args = list(node.args)
            with graph.inserting_before(node):
                for i in _PRODUCTS[node.target]:
                    if i < len(args) and isinstance(args[i], torch.fx.Node) and _dtype(args[i]) != common:
                        cast = graph.call_function(torch.ops.prims.convert_element_type.default, (args[i], common))
                        cast.meta["val"] = args[i].meta["val"].to(common)
                        args[i] = cast
            node.args = tuple(args)
            fake_out = node.meta["val"]
            node.meta["val"] = fake_out.to(common)
            node.meta.pop("tensor_meta", None)  # torch-mlir's importer prefers it to "val": it would keep the old dtype
            if out is not None and out != common:
                with graph.inserting_after(node):
                    back = graph.call_function(torch.ops.prims.convert_element_type.default, (node, out))
                back.meta["val"] = fake_out
                node.replace_all_uses_with(back, delete_user_cb=lambda u: u is not back)
                for spec in program.graph_signature.output_specs:  # outputs are found by these names
                    if getattr(spec.arg, "name", None) == node.name:
                        spec.arg.name = back.name
            self.stats.rewrite(f"{'x'.join(sorted(str(k).removeprefix('torch.') for k in {_dtype(a) for a in operands if isinstance(a, torch.fx.Node)}))}->{str(common).removeprefix('torch.')}")
        graph.lint()
        program.graph_module.recompile()
        return program
