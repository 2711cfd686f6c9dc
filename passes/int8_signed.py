"""int8-signed: unsigned 8-bit activations of a PT2E program re-encoded as signed int8 (any target).

Matches:  `quantized_decomposed.quantize_per_tensor(x, s, zp, qmin, qmax, torch.uint8)` with constant
          (Python) scale and zero point, whose result reaches only (directly or through layout ops:
          view, transpose, ...) `dequantize_per_tensor(., s, zp, qmin, qmax, torch.uint8)` with the
          same parameters: the activation pairs X86InductorQuantizer writes by default (zp in [0, 255]).
Produces: the same pair with zp - 128, qmin - 128, qmax - 128 and torch.int8; the fake-tensor metadata
          of q and of the layout ops between becomes int8, and a constant_pad_nd between them (the
          zero-point padding of qdq-contractions' im2col) pads with zp - 128.
Declines: a uint8 tensor used by anything but a matching dequantize (returned, fed to another op or
          dequantized with other parameters), tensor-valued scale/zero point (`.tensor` overloads).
Safe because: exact. With q_u = clamp(round(x / s) + zp, qmin, qmax),
          q_s = clamp(round(x / s) + zp - 128, qmin - 128, qmax - 128) = q_u - 128, and
          (q_s - (zp - 128)) * s = (q_u - zp) * s: every dequantized value is bit-identical, and the
          shifted bounds stay inside [-128, 127] because qmin >= 0 and qmax <= 255.
Why: IREE 3.13 turns Q/DQ around matmul/conv into integer contractions either way, but only signed
          int8 x int8 takes llvm-cpu's data-tiled i8 kernel: a 4 x Linear(1024, 1024) stack at batch
          64 ran 23.5 ms with uint8 activations against 5.0 ms signed and 7.1 ms in f32
          (docs/int8.md). On GPU targets the integer kernels take signed operands as well.
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, has_qdq, register_pass

_aten = torch.ops.aten

_qd = None


def _ops():
    global _qd
    if _qd is None:
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

        _qd = torch.ops.quantized_decomposed
    return _qd


@register_pass("int8-signed")
class Int8SignedPass(GraphPass):
    def applies(self, program) -> bool:
        return has_qdq(program)

    def run(self, program):
        qd = _ops()
        graph = program.graph_module.graph
        outputs = {getattr(s.arg, "name", None) for s in program.graph_signature.output_specs}
        for q in list(graph.nodes):
            if q.op != "call_function":
                continue
            if q.target in (qd.quantize_per_tensor.tensor, qd.quantize_per_tensor.tensor2) and _arg(q, 5, "dtype") == torch.uint8:
                self.stats.decline(q.name, "scale / zero point are tensors (only constant ones are re-encoded)")
                continue
            if q.target != qd.quantize_per_tensor.default or _arg(q, 5, "dtype") != torch.uint8:
                continue
            params = tuple(q.args[1:6])
            zp, qmin, qmax = params[1], params[2], params[3]
            if not (isinstance(zp, int) and 0 <= qmin <= qmax <= 255):
                self.stats.decline(q.name, f"zero point {zp!r} / bounds [{qmin}, {qmax}] outside uint8")
                continue
            layouts, users = _reach(q)
            if q.name in outputs or not users or any(
                u.target != qd.dequantize_per_tensor.default or tuple(u.args[1:6]) != params or u.name in outputs for u in users
            ) or any(n.name in outputs for n in layouts):
                self.stats.decline(q.name, "the uint8 tensor is used by something other than its dequantize")
                continue
            shifted = (params[0], zp - 128, qmin - 128, qmax - 128, torch.int8)
            q.args = (q.args[0], *shifted)
            for n in (q, *layouts):
                _retype(n, torch.int8)
                if n.target == _aten.constant_pad_nd.default:  # padding with the zero point: shifted with it
                    n.args = (n.args[0], n.args[1], n.args[2] - 128)
            for u in users:
                u.args = (u.args[0], *shifted, *u.args[6:])
                for rec in self.ctx.records.get("quantization", ()):
                    for scheme in rec["operands"]:
                        if scheme and scheme.get("dequantize") == u.name and rec["entry"] == self.ctx.entry:
                            scheme["compiled_as"] = f"int8, zero point {zp - 128} (int8-signed)"
            self.stats.rewrite(f"uint8 -> int8 ({len(users)} dequantize)")
        graph.lint()
        program.graph_module.recompile()
        return program


def _reach(q):
    """(layout ops between q and its dequantizes, the other nodes reached): q's users, following
    the view/transpose chains passes/qdq_contractions.py puts between q and a dequantize."""
    from llmc.passes.qdq_contractions import LAYOUT_OPS

    moves = LAYOUT_OPS | {_aten.slice.Tensor, _aten.stack.default, _aten.unfold.default, _aten.constant_pad_nd.default}  # and im2col's gather
    layouts, ends, todo = [], [], list(dict.fromkeys(q.users))
    while todo:
        n = todo.pop()
        if n in layouts:
            continue
        if n.op == "call_function" and n.target in moves:
            layouts.append(n)
            todo.extend(n.users)
        else:
            ends.append(n)
    return layouts, ends


def _retype(node, dtype) -> None:
    """The node's fake value and tensor metadata in `dtype` (torch-mlir's importer types a value from
    `tensor_meta` when there is one, else from `val`)."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        node.meta["val"] = val.to(dtype)
        if "tensor_meta" in node.meta:
            node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])


def _arg(node, index: int, name: str):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)
