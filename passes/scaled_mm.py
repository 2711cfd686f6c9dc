"""scaled-mm: `aten._scaled_mm` (an fp8 matrix product with scales) as widen, f32 product, scale.

Matches:  `aten._scaled_mm(a [M, K], b [K, N], scale_a, scale_b, bias, scale_result, out_dtype,
          use_fast_accum)` with float8 operands (E4M3FN, E5M2 and the FNUZ pair) and f32 scales that
          are per tensor (one element) or per row and column (scale_a [M, 1], scale_b [1, N]).
Produces: out = mm(f32(a), f32(b)) * f32(scale_a) * f32(scale_b) (+ f32(bias)), cast to out_dtype
          (a's dtype when out_dtype is None) (form "tensorwise" or "rowwise").
Safe because: every fp8 value is exact in f32 and a product of two has at most 8 significant bits,
          so the f32 accumulation is the accumulation PyTorch's CPU kernel does (it widens to f32,
          multiplies, scales and rounds once to out_dtype); measured on cpu: bf16 and f16 outputs
          equal eager's bit for bit for E4M3FN and E5M2, an f32 output within 1 ulp (the order of
          the sums and of scale and bias). `use_fast_accum` only allows a faster, less exact
          accumulation: ignoring it keeps the exact one.
Why: torch-mlir 20261001 has no lowering for `aten._scaled_mm`; the op stayed as it was and
          iree-compile stopped at its first operand with "failed to legalize operation
          'torch.constant.bool'" (the use_fast_accum flag) for E4M3FN and E5M2 alike.
Refuses (PassError, one line): block-scaled forms (float8_e8m0fnu scales, or scales of any other
          shape: MX formats need a blocked layout this rewrite does not express), `scale_result`
          (an fp8 output's scale), operands that are not float8.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, PassError, register_pass

_FP8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


def _form(a, b, scale_a, scale_b) -> str:
    if a.dtype not in _FP8 or b.dtype not in _FP8:
        raise PassError(f"scaled-mm: aten._scaled_mm of {a.dtype} x {b.dtype} operands is not supported (float8 operands)")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            raise PassError(f"scaled-mm: aten._scaled_mm with {name} of {s.dtype} (block-scaled, MX) is not supported; f32 per-tensor or per-row scales are")
    m, n = a.shape[0], b.shape[1]
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensorwise"
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        return "rowwise"
    raise PassError(f"scaled-mm: aten._scaled_mm with scales of shape {list(scale_a.shape)} and {list(scale_b.shape)} is not supported; "
                    f"per tensor (one element each) or per row and column ([{m}, 1] and [1, {n}]) are")


def scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None):
    """What aten._scaled_mm computes, written with ops every target lowers."""
    f32 = torch.float32
    out = torch.mm(a.to(f32), b.to(f32))
    sa = scale_a.reshape(()) if scale_a.numel() == 1 else scale_a
    sb = scale_b.reshape(()) if scale_b.numel() == 1 else scale_b
    out = out * sa.to(f32) * sb.to(f32)
    if bias is not None:
        out = out + bias.to(f32)
    return out.to(out_dtype if out_dtype is not None else a.dtype)


@register_pass("scaled-mm")
class ScaledMmPass(DecompositionPass):
    def decompositions(self) -> dict:
        def decomposed(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
            form = _form(a, b, scale_a, scale_b)
            if scale_result is not None:
                raise PassError("scaled-mm: aten._scaled_mm with scale_result (an fp8 output's scale) is not supported")
            self.rewrote_here(form)
            return scaled_mm(a, b, scale_a, scale_b, bias, out_dtype)

        return {torch.ops.aten._scaled_mm.default: decomposed}
