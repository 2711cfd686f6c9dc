"""log10-to-log: `aten.log10(x)` -> `aten.log(x) / ln(10)` on llvm-cpu.

Matches:  `torch.aten.log10` whose operand is a floating-point tensor (f16, bf16, f32, f64).
Produces: `torch.aten.log` of the same operand, then `torch.aten.div.Scalar` by ln(10) as an f64
          constant, with the original result type.
Declines: integer or complex operands (left as they are; torch-mlir's own lowering handles the
          int-to-float promotion there).
Safe because: log10(x) = ln(x) / ln(10) exactly in real arithmetic; in floating point the two
          roundings add at most one ulp over a correctly rounded log10 (libm's own log10f is
          accurate to about one ulp too). Special values carry over: ln(0) = -inf, ln(<0) = nan,
          ln(inf) = inf, each divided by a positive finite constant.
Why: IREE 3.13's llvm-cpu backend emits a call to libm's `log10f`, which its embedded linker cannot
          resolve: iree-compile fails with "iree-lld: error: undefined symbol: log10f".
"""

from __future__ import annotations

import math

from llmc.passes._base import IRPass, Requires, register_pass, walk_ops

_FLOATS = ("f16", "bf16", "f32", "f64")


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
            if elem not in _FLOATS:
                self.stats.decline(str(op.location), f"{elem or str(x.type)} operand")
                continue
            result_type = op.results[0].type
            with ir.InsertionPoint(op), op.location:
                log = ir.Operation.create("torch.aten.log", results=[result_type], operands=[x]).result
                ln10 = ir.Operation.create(
                    "torch.constant.float",
                    results=[ir.Type.parse("!torch.float")],
                    attributes={"value": ir.FloatAttr.get_f64(math.log(10.0))},
                ).result
                div = ir.Operation.create("torch.aten.div.Scalar", results=[result_type], operands=[log, ln10]).result
            op.results[0].replace_all_uses_with(div)
            op.erase()
            self.stats.rewrite()
