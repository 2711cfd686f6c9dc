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
          On llvm-cpu a 2-D convolution of a per-tensor dequantized input with per-channel
          weights becomes im2col + matmul here, on the int8 tensors: patches gathered from the
          int8 input padded with its zero point (which dequantizes to 0.0, the convolution's
          padding), dequantized, times the dequantized weight viewed [O, C*kh*kw]. IREE then forms
          a data-tiled int8 matmul; its own im2col (on for llvm-cpu, 13x faster than its direct int8
          convolution) runs before its Q/DQ rewrite and leaves an f32 matmul.
Why: IREE 3.13's global optimization forms an i8 x i8 -> i32 contraction only when the matmul or
          convolution reads the dequantize itself; with a view in between it dequantizes and runs
          the contraction in f32 (a Linear on a [2, 8, 64] input gave `matmul_16x128x64_f32`).
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, fill_fake_values, has_qdq, register_pass
from llmc.passes.qdq_float import runs_for as qdq_float_runs_for

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
                    fill_fake_values(graph)  # the conv rewrite below reads the new nodes' shapes
                    self.stats.rewrite(f"{op_name}: dequantize moved past {len(chain)} layout op(s)")
                    src = deq
                operands.append(src)
            rec = self._record(node, op_name, operands, per_tensor, per_channel, program)
            if op_name == "conv" and self.ctx.caps.backend == "llvm-cpu":
                why = _im2col_why_not(node, operands, per_tensor, per_channel)
                if why is None and qdq_float_runs_for(self.ctx) is None:
                    why = "Q/DQ become f32 math here (qdq-float)"
                if why is None:
                    deq = _im2col(graph, node, operands, per_tensor, program.graph_signature.output_specs)
                    rec["operands"][0]["dequantize"] = deq.name
                    self.stats.rewrite("conv: im2col of the int8 input + int8 matmul")
                    rec["lowered_as"] = "im2col of the int8 input, then an int8 x int8 -> i32 matmul (llmc)"
                else:
                    self.stats.decline(node.name, f"conv on llvm-cpu kept as a convolution: {why}")
                    rec["form"], rec["why"] = "float", f"llvm-cpu: left to IREE, whose im2col (on for llvm-cpu) precedes its Q/DQ rewrite ({why})"
            records.append(rec)
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
        if all(s is not None for s in schemes):
            rec["form"] = "integer"
        else:
            rec["form"] = "float"
            rec["why"] = "operand {} is not dequantized int8".format(", ".join(str(i) for i, s in enumerate(schemes) if s is None))
        return rec


def _im2col_why_not(node, operands, per_tensor, per_channel) -> str | None:
    x, w = operands
    if x is None or x.target != per_tensor or x is not node.args[0]:
        return "input not a per-tensor dequantize"
    if w is None or w.target != per_channel or w.args[3] != 0 or w is not node.args[1]:
        return "weight not dequantized per output channel"
    _, _, _, _, _, _, transposed, _, groups = node.args
    if transposed or groups != 1:
        return "transposed or grouped"
    if len(x.meta["val"].shape) != 4:
        return "not 2-D"
    if not all(isinstance(d, int) for d in (*x.meta["val"].shape, *w.meta["val"].shape)):
        # Tracing the gather with a symbolic batch specialized the symbol (the program then took only
        # the example's batch); left to IREE, which runs it as a dequantize + f32 matmul.
        return "dynamic shape"
    return None


def _im2col(graph, node, operands, per_tensor, outputs):
    """conv2d(dequant(qx), dequant_per_channel(qw)) as dequant(patches(qx)) @ dequant(qw.view(O, K)).T:
    the patches are gathered from the int8 input (padded with its zero point, which dequantizes to
    0.0 as the convolution's zero padding does), so IREE forms an int8 matmul, which it data-tiles;
    its own im2col (on for llvm-cpu) runs before its Q/DQ rewrite and leaves an f32 matmul."""
    from llmc.passes import _packed

    x, w = operands
    _, _, bias, stride, padding, dilation, *_ = node.args
    _, c, h, wd = x.meta["val"].shape
    o, _, kh, kw = w.meta["val"].shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    qx, zp = x.args[0], x.args[2]
    call = graph.call_function
    with graph.inserting_before(node):
        padded = call(_aten.constant_pad_nd.default, (qx, [pw, pw, ph, ph], zp)) if ph or pw else qx
        # [N, C, Ho, Wo, kh, kw] windows (views), then [N, Ho, Wo, C, kh, kw] copied: one gather
        win = call(_aten.unfold.default, (call(_aten.unfold.default, (padded, 2, kh, sh)), 3, kw, sw)) if (dh, dw) == (1, 1) else None
        if win is not None:
            cols = call(_aten.clone.default, (call(_aten.permute.default, (win, [0, 2, 3, 1, 4, 5])),), {"memory_format": torch.contiguous_format})
            cols = call(_aten.view.default, (cols, [-1, c * kh * kw]))
        else:
            taps = []
            for i in range(kh):
                rows = call(_aten.slice.Tensor, (padded, 2, i * dh, i * dh + (ho - 1) * sh + 1, sh))
                for j in range(kw):
                    taps.append(call(_aten.slice.Tensor, (rows, 3, j * dw, j * dw + (wo - 1) * sw + 1, sw)))
            cols = call(_aten.stack.default, (taps, 2))  # [N, C, kh*kw, Ho, Wo]: K ordered (c, i, j) as the weight's
            cols = call(_aten.view.default, (cols, [-1, c * kh * kw, ho * wo]))
            cols = call(_aten.clone.default, (call(_aten.permute.default, (cols, [0, 2, 1])),), {"memory_format": torch.contiguous_format})
            cols = call(_aten.view.default, (cols, [-1, c * kh * kw]))
        a = call(per_tensor, (cols, *x.args[1:]), dict(x.kwargs))
        wq = w.args[0]
        if not w.args[0].meta["val"].is_contiguous():  # a channels-last model's weight: copied (a constant IREE folds)
            wq = call(_aten.clone.default, (wq,), {"memory_format": torch.contiguous_format})
        wq = call(_aten.view.default, (wq, [o, c * kh * kw]))
        b = call(_aten.permute.default, (call(w.target, (wq, *w.args[1:]), dict(w.kwargs)), [1, 0]))
        out = call(_aten.addmm.default, (bias, a, b)) if bias is not None else call(_aten.mm.default, (a, b))
        out = call(_aten.view.default, (out, [-1, ho, wo, o]))
        out = call(_aten.clone.default, (call(_aten.permute.default, (out, [0, 3, 1, 2])),), {"memory_format": torch.contiguous_format})
    _packed.replace(graph, node, out, outputs)
    return a


def _layout_chain(value):
    """(layout ops from the source to `value`, in order; the node they start from)."""
    chain = []
    node = value
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in LAYOUT_OPS:
        chain.append(node)
        node = node.args[0]
    return list(reversed(chain)), node if isinstance(node, torch.fx.Node) and node.op == "call_function" else None
