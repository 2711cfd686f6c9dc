"""log10-to-log: `aten.log10(x)` -> `aten.log(x) / ln(10)` on llvm-cpu.

Matches:  `torch.aten.log10` whose operand is a floating-point tensor (f16, bf16, f32, f64), or an
          integer / bool tensor with a floating-point result (torch promotes it to the default
          float dtype).
Produces: `torch.aten.log` of the operand (an integer operand first converted to the result's float
          type with `torch.aten.to.dtype`), then `torch.aten.div.Scalar` by ln(10) as an f64
          constant, with the original result type.
Declines: complex operands (left as they are).
Safe because: log10(x) = ln(x) / ln(10) exactly in real arithmetic; in floating point the two
          roundings add at most one ulp over a correctly rounded log10 (libm's own log10f is
          accurate to about one ulp too). Special values carry over: ln(0) = -inf, ln(<0) = nan,
          ln(inf) = inf, each divided by a positive finite constant. An integer operand is
          converted exactly as eager converts it (to the result dtype, then log10 in that dtype).
Why: IREE 3.13's llvm-cpu backend emits a call to libm's `log10f`, which its embedded linker cannot
          resolve: iree-compile fails with "iree-lld: error: undefined symbol: log10f" (and
          "log10" in f64). torch-mlir's lowering of an integer log10 converts to float inside the
          same elementwise op and hits the same call (torch-mlir's e2e ElementwiseLog10IntModule).
"""

from __future__ import annotations

import math

from llmc.passes._base import IRPass, Requires, register_pass, walk_ops

_FLOATS = ("f16", "bf16", "f32", "f64")
_INTS = ("i1", "si8", "si16", "si32", "si64", "ui8")
_TORCH_DTYPE = {"f16": 5, "f32": 6, "f64": 7, "bf16": 15}  # torch ScalarType numbers


def _element_type(type_text: str) -> str:
    # !torch.vtensor<[4,?],f32> -> f32
    return type_text.rsplit(",", 1)[-1].rstrip(">").strip() if type_text.startswith("!torch.vtensor<") else ""


@register_pass("log10-to-log", Requires(backends=("llvm-cpu",)))
class Log10ToLogPass(IRPass):
    def run(self, module) -> None:
        from torch_mlir import ir

        for op in walk_ops(module, {"torch.aten.log10"}):
            x = op.operands[0]
            elem = _element_type(str(x.type))
            result_type = op.results[0].type
            result_elem = _element_type(str(result_type))
            if elem not in _FLOATS and not (elem in _INTS and result_elem in _FLOATS):
                self.stats.decline(str(op.location), f"{elem or str(x.type)} operand")
                continue
            with ir.InsertionPoint(op), op.location:
                if elem in _INTS:
                    x = _to_dtype(ir, x, result_elem)
                log = ir.Operation.create("torch.aten.log", results=[result_type], operands=[x]).result
                ln10 = ir.Operation.create(
                    "torch.constant.float",
                    results=[ir.Type.parse("!torch.float")],
                    attributes={"value": ir.FloatAttr.get_f64(math.log(10.0))},
                ).result
                div = ir.Operation.create("torch.aten.div.Scalar", results=[result_type], operands=[log, ln10]).result
            op.results[0].replace_all_uses_with(div)
            op.erase()
            self.stats.rewrite("int" if elem in _INTS else "float")


def _to_dtype(ir, x, elem: str):
    """torch.aten.to.dtype(x, elem): x's shape with the result's element type."""
    def const(name: str, ty: str, attributes: dict):
        return ir.Operation.create(name, results=[ir.Type.parse(ty)], attributes=attributes).result

    dtype = const("torch.constant.int", "!torch.int", {"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), _TORCH_DTYPE[elem])})
    false = const("torch.constant.bool", "!torch.bool", {"value": ir.BoolAttr.get(False)})
    none = const("torch.constant.none", "!torch.none", {})
    shape = str(x.type)[len("!torch.vtensor<"):].rsplit(",", 1)[0]
    return ir.Operation.create("torch.aten.to.dtype", results=[ir.Type.parse(f"!torch.vtensor<{shape},{elem}>")],
                               operands=[x, dtype, false, false, none]).result
