"""qdq-contractions: every matmul / linear / conv of a PT2E program reads its dequantize directly (any target).

Matches:  each contraction (aten.mm, addmm, bmm, convolution) of the decomposed program whose operand
          is `dequantize_per_tensor(q, s, zp, ...)` reached through layout ops only (view, reshape,
          permute, transpose, expand, clone, squeeze/unsqueeze, alias): a linear on a 3-D activation
          (`x.view(B*T, D)` between the dequantize and the mm), an attention matmul on a
          `view(...).transpose(1, 2)` of a quantized tensor.
Produces: the same layout ops applied to the int8 tensor q, then one dequantize_per_tensor with the
          same parameters feeding the contraction (the original chain stays for any other user). Every
          contraction is then recorded for the manifest (`quantization`): its module, operation,
          form ("integer" when both operands are dequantized int8, else "float" with the reason)
          and each operand's scheme (per-tensor / per-channel with axis, int8 / uint8, symmetric or
          not).
Leaves:   a per-channel dequantize behind layout ops (a weight's transpose: IREE folds it, and
          moving it would move the channel axis), an operand that is not dequantized (the
          contraction stays float: recorded with the reason).
Safe because: a per-tensor dequantize is the same affine map (q - zp) * s on every element, and the
          layout ops only move, copy or broadcast elements: layout(dequant(q)) == dequant(layout(q))
          bit for bit.
          On llvm-cpu a convolution is recorded as float: llmc turns on IREE's im2col there, which
          rewrites it to a dequantize + f32 matmul before the integer rewrite (still 13x faster
          than IREE's direct int8 convolution; docs/int8.md).
Why: IREE 3.13's global optimization forms an i8 x i8 -> i32 contraction only when the matmul or
          convolution reads the dequantize itself; with a view in between it dequantizes and runs
          the contraction in f32 (a Linear on a [2, 8, 64] input gave `matmul_16x128x64_f32`).
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, fill_fake_values, has_qdq, register_pass

_aten = torch.ops.aten
LAYOUT_OPS = {
    _aten.view.default, _aten._unsafe_view.default, _aten.reshape.default, _aten.permute.default, _aten.t.default,
    _aten.transpose.int, _aten.expand.default, _aten.clone.default, _aten.unsqueeze.default, _aten.squeeze.dim,
    _aten.squeeze.dims, _aten.alias.default,
}
# contraction -> (operation name for the manifest, positions of its two multiplied operands)
CONTRACTIONS = {
    _aten.mm.default: ("linear/matmul", (0, 1)),
    _aten.addmm.default: ("linear", (1, 2)),
    _aten.bmm.default: ("batch matmul", (0, 1)),
    _aten.convolution.default: ("conv", (0, 1)),
}


def _qd():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    return torch.ops.quantized_decomposed


@register_pass("qdq-contractions")
class QdqContractionsPass(GraphPass):
    def applies(self, program) -> bool:
        return has_qdq(program)

    def run(self, program):
        qd = _qd()
        graph = program.graph_module.graph
        records = self.ctx.records.setdefault("quantization", [])
        per_tensor, per_channel = qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in CONTRACTIONS:
                continue
            op_name, positions = CONTRACTIONS[node.target]
            operands = []
            for pos in positions:
                chain, src = _layout_chain(node.args[pos])
                if src is not None and src.target == per_tensor and chain:
                    with graph.inserting_before(node):
                        value = src.args[0]
                        for layout in chain:
                            value = graph.call_function(layout.target, (value, *layout.args[1:]), dict(layout.kwargs))
                        deq = graph.call_function(per_tensor, (value, *src.args[1:]), dict(src.kwargs))
                    node.replace_input_with(node.args[pos], deq)
                    self.stats.rewrite(f"{op_name}: dequantize moved past {len(chain)} layout op(s)")
                    src = deq
                operands.append(src)
            records.append(self._record(node, op_name, operands, per_tensor, per_channel, program))
        fill_fake_values(graph)
        graph.eliminate_dead_code()
        graph.lint()
        program.graph_module.recompile()
        return program

    def _record(self, node, op_name, operands, per_tensor, per_channel, program) -> dict:
        stack = node.meta.get("nn_module_stack") or {}
        module = next(reversed(stack.values()))[0] if stack else ""
        names = {getattr(spec.arg, "name", None): spec.target for spec in program.graph_signature.input_specs}
        rec = {"entry": self.ctx.entry, "node": node.name, "module": module, "op": op_name}
        schemes = []
        for src in operands:
            if src is None or src.target not in (per_tensor, per_channel):
                schemes.append(None)
                continue
            qdtype = src.args[6] if src.target == per_channel else src.args[5]
            scheme = {"granularity": "per-tensor" if src.target == per_tensor else f"per-channel (axis {src.args[3]})",
                      "dtype": str(qdtype).replace("torch.", ""), "range": [src.args[4 if src.target == per_channel else 3],
                                                                             src.args[5 if src.target == per_channel else 4]]}
            if src.target == per_tensor:
                scheme["zero_point"] = src.args[2]
                scheme["symmetric"] = src.args[2] == 0
                scheme["dequantize"] = src.name
            else:
                zp = src.args[2]
                stored = program.state_dict.get(names.get(getattr(zp, "name", None)))
                stored = stored if stored is not None else program.constants.get(names.get(getattr(zp, "name", None)))
                scheme["symmetric"] = bool(stored is not None and not torch.count_nonzero(stored))
                weight = names.get(getattr(src.args[0], "name", None))
                if weight:
                    scheme["weight"] = weight
            schemes.append(scheme)
        rec["operands"] = schemes
        if op_name == "conv" and self.ctx.caps.backend == "llvm-cpu":
            # compiler/targets.py turns on im2col for llvm-cpu; IREE applies it before its Q/DQ rewrite
            rec["form"] = "float"
            rec["why"] = ("llvm-cpu: IREE converts convolutions to im2col + f32 matmul before forming integer math "
                          "(13x faster than its direct int8 convolution)")
        elif all(s is not None for s in schemes):
            rec["form"] = "integer"
        else:
            rec["form"] = "float"
            rec["why"] = "operand {} is not dequantized int8".format(", ".join(str(i) for i, s in enumerate(schemes) if s is None))
        return rec


def _layout_chain(value):
    """(layout ops from the source to `value`, in order; the node they start from)."""
    chain = []
    node = value
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in LAYOUT_OPS:
        chain.append(node)
        node = node.args[0]
    return list(reversed(chain)), node if isinstance(node, torch.fx.Node) and node.op == "call_function" else None
