"""int-elementwise: elementwise ops on integer tensors that torch-mlir lowers wrongly or not at all.

Matches:  - `aten.clamp(x, min, max)` with an integer x and a float bound (the result is float);
          - `aten.pow.Tensor_Tensor(base, exponent)` with both integer (the result is integer);
          - `aten.threshold_backward(grad, self, threshold)` with grad and self of different dtypes;
          - `aten.div(a, b, rounding_mode="floor")` of integers (`//`, floor_divide).
          Every other call of these ops is left as it is (NotImplemented; threshold_backward goes
          to the decomposition llmc's base table has for it).
Produces: - clamp: x converted to the result's float dtype, then the float clamp;
          - pow: exponentiation by squaring over the exponent's bits, in the result's integer
            dtype: result *= base where the bit is set, base *= base, one step per bit (32 for
            int32, 64 for int64); a negative exponent gives 1 for base 1, +-1 for base -1 by the
            exponent's parity, and 0 otherwise, as eager's integer pow does;
          - threshold_backward: `where(self <= threshold, 0, grad)` in the promoted dtype of grad
            and self (eager's result dtype);
          - floor division: the truncating quotient q, minus 1 where the remainder a - q*b is
            nonzero with a sign unlike b's.
Safe because: clamp: eager promotes x to the bounds' float type before comparing, as here.
          pow: x^e = prod over set bits k of x^(2^k), and integer products wrap modulo 2^n in any
          order, so the result equals eager's (which also wraps) bit for bit. threshold_backward
          is that where by definition; only its result dtype was lost. Floor and truncation differ
          exactly when the division is inexact and the quotient negative, i.e. the remainder is
          nonzero and its sign (a's) differs from b's; all in integers, no rounding.
Why: torch-mlir 20261001 + IREE 3.13: clamp of an int tensor with float bounds emits a float
          comparison of an integer ("'arith.cmpf' op operand #0 must be floating-point-like, but
          got 'i64'", e2e ElementwiseClampIntToFloatModule); integer pow of tensors is not lowered
          ("unimplemented: non-floating point dtype", e2e PowIntIntModule); and the
          threshold_backward decomposition returns grad's dtype, int64 where eager returns float32
          (e2e ThresholdBackward2dMixedModule: a wrong dtype, no error); and integer floor
          division goes through floating point: (2^63 - 2) // 2^30 gave 8589934592 where eager
          has 8589934591 (e2e ElementwiseDivScalarRoundingModeFloorInt64Module), while the
          truncating division is exact.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass

_aten = torch.ops.aten


def _is_int(t) -> bool:
    return isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def int_pow(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """base ** exponent for integer tensors (broadcast), wrapping as eager does."""
    dtype = torch.result_type(base, exponent)
    base, exponent = torch.broadcast_tensors(base.to(dtype), exponent.to(dtype))
    e = torch.where(exponent < 0, torch.zeros_like(exponent), exponent)
    result = torch.ones_like(base)
    b = base
    for _ in range(torch.iinfo(dtype).bits):
        result = torch.where((e & 1) == 1, result * b, result)
        b = b * b
        e = e >> 1
    one, zero = torch.ones_like(base), torch.zeros_like(base)
    odd = (exponent & 1) == 1
    negative = torch.where(base == 1, one, torch.where(base == -1, torch.where(odd, -one, one), zero))
    return torch.where(exponent < 0, negative, result)


def int_floor_div(a: torch.Tensor, b) -> torch.Tensor:
    """floor(a / b) for integers, from the truncating quotient: one less where the remainder is
    nonzero and its sign differs from the divisor's."""
    q = torch.div(a, b, rounding_mode="trunc")
    r = a - q * b
    unlike = (r < 0) != (b < 0) if isinstance(b, torch.Tensor) else (r > 0 if b < 0 else r < 0)
    return q - ((r != 0) & unlike).to(q.dtype)


@register_pass("int-elementwise")
class IntElementwisePass(DecompositionPass):
    def decompositions(self) -> dict:
        from torch_mlir.extras.fx_decomp_util import get_decomposition_table  # llmc's base table is torch-mlir's

        table_threshold_backward = get_decomposition_table().get(_aten.threshold_backward.default)

        def clamp(x, min=None, max=None):
            bound = min if min is not None else max
            if not _is_int(x) or not isinstance(bound, float):
                return NotImplemented
            self.rewrote_here("clamp")
            return torch.clamp(x.to(torch.result_type(x, bound)), min, max)

        def pow_tensors(base, exponent):
            if not (_is_int(base) and _is_int(exponent)):
                return NotImplemented
            self.rewrote_here("pow")
            return int_pow(base, exponent)

        def threshold_backward(grad, x, threshold):
            if grad.dtype == x.dtype:  # the decomposition llmc's table had for it
                return NotImplemented if table_threshold_backward is None else table_threshold_backward(grad, x, threshold)
            self.rewrote_here("threshold_backward")
            dtype = torch.result_type(grad, x)
            return torch.where(x <= threshold, torch.zeros((), dtype=dtype), grad.to(dtype))

        def div_floor(a, b, *, rounding_mode=None):
            if rounding_mode != "floor" or not _is_int(a) or not (_is_int(b) or isinstance(b, int)):
                return NotImplemented
            self.rewrote_here("div_floor")
            return int_floor_div(a, b)

        return {
            _aten.div.Tensor_mode: div_floor,
            _aten.div.Scalar_mode: div_floor,
            _aten.clamp.default: clamp,
            _aten.pow.Tensor_Tensor: pow_tensors,
            _aten.threshold_backward.default: threshold_backward,
        }
