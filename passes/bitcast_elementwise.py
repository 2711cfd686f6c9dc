"""bitcast-elementwise: a same-width `aten.view.dtype` as an elementwise bitcast IREE can fuse.

Matches:  `torch.aten.view.dtype` whose operand and result element types have the same width of 16,
          32 or 64 bits (e.g. si32 -> f32, the last step of the fp8 and bf16 weight decodes). An
          8-bit view (int8 -> float8, a native fp8 decode of a parameter) is left alone: it is a
          free reinterpretation of the parameter's storage.
Produces: `torch_c.to_builtin_tensor`, a call to a private function holding one `linalg.generic`
          whose body is `arith.bitcast` (one function per shape and type pair, inlined by IREE),
          and `torch_c.from_builtin_tensor` with the original result type.
Safe because: a same-width view reinterprets each element's bits in place; `arith.bitcast` on each
          element does exactly that, with the same shape and layout.
Why: torch-mlir lowers `view.dtype` to a tensor-level bitcast that IREE does not fuse with
          elementwise producers or consumers. In the fp8 weight decode that splits one elementwise
          chain in two full-size dispatches per weight and per call, and keeps the decode out of
          the matmul: a 125M Llama decoded at 1.1 token/s on cpu (fp8) against 32.6 in f32. As a
          linalg.generic the chain fuses into the matmul, which then reads 1 byte per weight.
"""

from __future__ import annotations

from llmc.passes._base import IRPass, Requires, builtin_tensor, elementwise_function, register_pass, vtensor_dims, walk_ops

_BUILTIN = {"si16": "i16", "si32": "i32", "si64": "i64", "ui16": "i16", "ui32": "i32", "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64"}
_WIDTH = {"i16": 16, "f16": 16, "bf16": 16, "i32": 32, "f32": 32, "i64": 64, "f64": 64}


def _helper(name: str, dims: list[str], src: str, dst: str) -> str:
    """A private function bitcasting a tensor<dims x src> to dst element by element."""
    return elementwise_function(name, dims, src, 1, dst, [f"%c = arith.bitcast %x0 : {src} to {dst}"], "%c")


@register_pass("bitcast-elementwise", Requires())
class BitcastElementwisePass(IRPass):
    def run(self, module) -> None:
        from torch_mlir import ir

        helpers: dict[str, str] = {}
        for op in walk_ops(module, {"torch.aten.view.dtype"}):
            src, dst = vtensor_dims(str(op.operands[0].type)), vtensor_dims(str(op.results[0].type))
            if src is None or dst is None:
                self.stats.decline(str(op.location), "not a value tensor")
                continue
            (dims, s_elem), (_, d_elem) = src, dst
            s, d = _BUILTIN.get(s_elem), _BUILTIN.get(d_elem)
            if s is None or d is None or _WIDTH[s] != _WIDTH[d]:
                self.stats.decline(str(op.location), f"{s_elem} -> {d_elem} (8-bit or widths differ)")
                continue
            name = f"__llmc_bitcast_{'x'.join(d_ if d_ != '?' else 'D' for d_ in dims) or 'scalar'}_{s}_{d}"
            if name not in helpers:
                helper_module = ir.Module.parse(_helper(name, dims, s, d), module.context)
                fn = helper_module.body.operations[0]
                module.body.append(fn)
                helpers[name] = name
            t_in, t_out = ir.Type.parse(builtin_tensor(dims, s)), ir.Type.parse(builtin_tensor(dims, d))
            with ir.InsertionPoint(op), op.location:
                builtin = ir.Operation.create("torch_c.to_builtin_tensor", results=[t_in], operands=[op.operands[0]]).result
                call = ir.Operation.create(
                    "func.call", results=[t_out], operands=[builtin],
                    attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
                ).result
                back = ir.Operation.create("torch_c.from_builtin_tensor", results=[op.results[0].type], operands=[call]).result
            op.results[0].replace_all_uses_with(back)
            op.erase()
            self.stats.rewrite(f"{s_elem}->{d_elem}")
