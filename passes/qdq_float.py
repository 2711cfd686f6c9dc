"""qdq-float: a PT2E program's quantize / dequantize written out as float math (targets without a
correct integer lowering).

Runs:     where the arch lacks 64-bit integer arithmetic (compiler/targets.py `int64`: Mali valhall4,
          Adreno), or when the pass option `int8_math` is "float" (`llmc compile --int8-math float`).
Matches:  `quantized_decomposed.dequantize_per_tensor(q, s, zp, ...)`, `dequantize_per_channel(q, S, ZP,
          axis, ...)` and `quantize_per_tensor(x, s, zp, qmin, qmax, dtype)` with constant (Python)
          scalars.
Produces: dequantize: (float(q) - zp) * s, per channel with S and ZP viewed along `axis`; a zero-point
          tensor only dequantizes read is stored as f32 in place of int64. quantize:
          clamp(round(x * (1 / s)) + zp, qmin, qmax) converted to the integer dtype. Weights and
          activations stay 8-bit in memory; contractions run in f32.
Declines: quantize_per_channel and the `.tensor` overloads (tensor-valued scale / zero point), left to
          IREE's own lowering.
Safe because: these are the formulas of PyTorch's reference kernels (torch/ao/quantization/fx/
          _decomposed.py), with the same operation order; q - zp of 8-bit values and zero points in
          [-255, 255] is exact in f32 as in int64, so each dequantized value is bit-identical, and
          the contraction is the f32 one eager PT2E runs.
Why: IREE 3.13 lowers Q/DQ around matmul/conv to i8 x i8 -> i32 contractions whose zero-point
          corrections use i64 vectors; a device without Int64 fails in SPIR-V conversion ("failed to
          legalize operation 'vector.broadcast'" / "'vector.insert_strided_slice'" on adreno and
          valhall4). Float math after an 8-bit load compiles everywhere.
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, fill_fake_values, has_qdq, register_pass

_aten = torch.ops.aten


def runs_for(ctx) -> str | None:
    if ctx.options.get("int8_math") == "float":
        return None
    if not getattr(ctx.arch, "int64", True):
        return None
    return f"arch {ctx.target.arch} lowers int8 contractions in integer arithmetic (it has int64); --int8-math float forces this form"


@register_pass("qdq-float", Requires(check=runs_for))
class QdqFloatPass(GraphPass):
    def applies(self, program) -> bool:
        return has_qdq(program)

    def run(self, program):
        return self._rewrite(program, lambda node: True)

    def _rewrite(self, program, select):
        """Rewrite the Q/DQ nodes `select` accepts (all of them for this pass)."""
        import torch.ao.quantization.fx._decomposed  # noqa: F401

        qd = torch.ops.quantized_decomposed
        graph = program.graph_module.graph
        names = {getattr(spec.arg, "name", None): spec.target for spec in program.graph_signature.input_specs}
        floated: dict = {}
        self._outputs = program.graph_signature.output_specs
        for node in list(graph.nodes):
            if node.op != "call_function" or not select(node):
                continue
            if node.target in (qd.quantize_per_tensor.tensor, qd.dequantize_per_tensor.tensor, qd.quantize_per_channel.default,
                               qd.quantize_per_tensor.tensor2, qd.dequantize_per_tensor.tensor2):
                self.stats.decline(node.name, f"{node.target._opname}.{node.target._overloadname}: tensor-valued parameters")
                continue
            if node.target == qd.dequantize_per_tensor.default:
                q, s, zp = node.args[:3]
                out = node.kwargs.get("out_dtype") or torch.float32
                with graph.inserting_before(node):
                    value = graph.call_function(_aten._to_copy.default, (q,), {"dtype": out})
                    value = graph.call_function(_aten.mul.Tensor, (graph.call_function(_aten.sub.Tensor, (value, zp)), s))
                self._replace(graph, node, value)
                self.stats.rewrite("dequantize per tensor")
            elif node.target == qd.dequantize_per_channel.default:
                q, scales, zps, axis = node.args[:4]
                out = node.kwargs.get("out_dtype") or torch.float32
                rank = len(node.meta["val"].shape)
                axis = axis % rank
                shape = [1] * rank
                shape[axis] = -1
                with graph.inserting_before(node):
                    value = graph.call_function(_aten._to_copy.default, (q,), {"dtype": torch.float32})
                    if zps is not None:
                        zf = self._float_zero_points(program, graph, zps, names, floated, qd)
                        value = graph.call_function(_aten.sub.Tensor, (value, graph.call_function(_aten.view.default, (zf, shape))))
                    value = graph.call_function(_aten.mul.Tensor, (value, graph.call_function(_aten.view.default, (scales, shape))))
                    if out != torch.float32:
                        value = graph.call_function(_aten._to_copy.default, (value,), {"dtype": out})
                self._replace(graph, node, value)
                self.stats.rewrite("dequantize per channel")
            elif node.target == qd.quantize_per_tensor.default:
                x, s, zp, qmin, qmax, dtype = node.args[:6]
                with graph.inserting_before(node):
                    value = graph.call_function(_aten.round.default, (graph.call_function(_aten.mul.Tensor, (x, 1.0 / s)),))
                    value = graph.call_function(_aten.clamp.default, (graph.call_function(_aten.add.Tensor, (value, zp)), qmin, qmax))
                    value = graph.call_function(_aten._to_copy.default, (value,), {"dtype": dtype})
                self._replace(graph, node, value)
                self.stats.rewrite("quantize per tensor")
        for rec in self.ctx.records.get("quantization", ()) if self.name == "qdq-float" else ():
            if rec["entry"] == self.ctx.entry and rec["form"] == "integer":
                rec["form"] = "float"
                rec["why"] = "qdq-float: quantize / dequantize as f32 math (arch without int64, or --int8-math float)"
        fill_fake_values(graph)
        graph.eliminate_dead_code()
        graph.lint()
        program.graph_module.recompile()
        return program

    def _replace(self, graph, node, value) -> None:
        _packed.replace(graph, node, value, self._outputs)

    @staticmethod
    def _float_zero_points(program, graph, zps, names, floated, qd):
        """The zero points as f32: a stored tensor that only dequantizes read is replaced by its f32
        copy (no int64 left on the device); anything else is converted where it is read."""
        key = names.get(getattr(zps, "name", None))
        table = program.state_dict if key in program.state_dict else program.constants if key in program.constants else None
        readers_ok = all(u.op == "call_function" and u.target == qd.dequantize_per_channel.default and u.args[2] is zps for u in zps.users)
        if table is not None and readers_ok and zps.op == "placeholder":
            if key not in floated:
                stored = table[key]
                table[key] = stored.to(torch.float32)
                fake = zps.meta.get("val")
                mode = getattr(fake, "fake_mode", None)
                zps.meta["val"] = mode.from_tensor(table[key], static_shapes=True) if mode is not None else table[key]
                zps.meta.pop("tensor_meta", None)
                floated[key] = zps
            return zps
        return graph.call_function(_aten._to_copy.default, (zps,), {"dtype": torch.float32})


_WIDE = (torch.int16, torch.int32)


def qdq_dtype(node):
    """The integer dtype a quantized_decomposed quantize / dequantize node converts to or from."""
    at = 5 if node.target._opname.endswith("per_tensor") else 6  # (x, scale(s), zero point(s), [axis,] qmin, qmax, dtype)
    return node.args[at] if len(node.args) > at else node.kwargs.get("dtype")


def _is_wide_qdq(node) -> bool:
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and target.namespace == "quantized_decomposed"
            and qdq_dtype(node) in _WIDE)


@register_pass("qdq-wide-float")
class QdqWideFloatPass(QdqFloatPass):
    """qdq-wide-float: int16 / int32 quantize and dequantize as f32 math, on every target.

    Matches:  the quantized_decomposed nodes qdq-float takes (per-tensor quantize and dequantize,
              per-channel dequantize, constant scalars) whose integer dtype is int16 or int32 (an
              int32-quantized bias, an int32 result, int16 activations). int8 / uint8 nodes are left
              to qdq-contractions' integer path.
    Produces: qdq-float's formulas for those nodes only.
    Safe because: they are PyTorch's reference formulas in its own order and precision (f32), so
              the values are the ones eager computes, int32 values beyond 2^24 rounded alike.
    Why: llmc's integer path (IREE's i8 x i8 -> i32 contractions) is for 8-bit operands; torch-mlir's
              e2e Conv2dQInt8Module (int32 bias and result) and Conv2dQInt16Module were refused.
    """

    def applies(self, program) -> bool:
        return any(n.op == "call_function" and _is_wide_qdq(n) for n in program.graph.nodes)

    def run(self, program):
        return self._rewrite(program, _is_wide_qdq)
