"""fp8-weights: linear weights quantized to fp8 E4M3, stored 1 byte per weight, decoded where used.

Matches:  with `--dtype fp8`, every floating 2-D parameter of the exported program that feeds a matrix
          product (aten.mm / addmm / bmm / matmul / linear, through views and transposes): the linear
          layers. Embedding tables (aten.embedding) are left alone unless the `fp8_embeddings` option
          is set; parameters matching an `fp8_exclude` pattern (fnmatch, e.g. `lm_head.*`; the CLI's
          --quant-exclude / --fp8-exclude) and written buffers are left alone, with the reason in the
          stats. The pass body is shared with `int8-weights` (passes/_quantized_weights.py, this file
          gives the E4M3 codec and the native decodes).
Produces: per output channel (row) s = amax|w_row| / 448 (or one s per tensor with `fp8_scales=
          "tensor"`), q = e4m3fn(w / s) rounded to nearest even, stored as an int8 parameter with the
          same bits; s is an f32 buffer `<name>_fp8_scale` ([rows, 1]). Where the weight was used:
              w' = decode(q) * s     in the program's compute dtype (f32 on cpu, f16 on GPUs)
          On cpu (software decode) every weight a matrix product reads is stored packed,
          P[ceil(N/G), K, G] (P[b, k, j] = q[Gb + j, k], rows padded with zeros; G = 32 where the C
          matvec kernel serves the target, compiler/ukernels.py, else 8; where every CPU of the module
          has AVX512_BF16 and K is even, the kernel's pair layout, 64 channels, `llmc::matvec_fp8dp`:
          passes/_packed.py pack_pairs), and its uses are
          rewritten by passes/_packed.py: `x @ w.T` with one row of x becomes
              (x.view(1, K/4, 4, 1) * decode(P).view(N/G, K/4, 4, G)).sum(1).sum(1).view(1, N) * s.T
          (or `llmc::matvec_fp8(x, P) * s.T`, the same unscaled sum in the C kernel)
          (+ bias for addmm; K % 4 != 0 keeps one partial sum per channel), which IREE compiles to a
          transpose-free vectorized reduction with 4 independent accumulators (docs/targets.md); an
          embedding of a tied table gathers its rows' codes from P; every other use reads
          decode(P) * s unpacked to [N, K]. Same values: only the summation order of the f32 dot
          product differs from the matmul's.
          decode is chosen from the arch's capabilities (compiler/targets.py `fp8`):
            - "e4m3fnuz" native (gfx942): the FN bits are converted to FNUZ losslessly (same bits,
              value halved: the scale doubles; 0x80, FN's -0, becomes 0x00, FNUZ's +0) and viewed
              as float8_e4m3fnuz, then widened;
            - "e4m3fn" native (gfx950, gfx12xx): viewed as float8_e4m3fn, then widened;
            - none (cpu, SPIR-V, gfx1100, cuda): integer ops only: sign, exponent and mantissa bits
              moved into an f32's places (a bitcast the `bitcast-elementwise` IR pass keeps fusable),
              times s * 2^120 (the exponent bias difference, folded into the row's scale; weights
              beyond 1e5 in magnitude would overflow it and are left unquantized).
Safe because: every decode is exact for every finite E4M3 code (tests check all 256; a subnormal code
          is an f32 subnormal before the multiply, exact unless a device flushes denormals, where
          it is off by less than 2^-15 of its row's largest weight), so the program
          computes with exactly the dequantized weights decode(q) * s; the quantizer clamps to
          +-448 and never produces a NaN code. The math after the decode is the compute dtype's.
Why: fp8 as PyTorch writes it compiles nowhere in IREE 3.13: an f8 constant cannot be serialized
          ("unhandled float element bit width 8"), gfx942 rejects FN and gfx950/gfx1100 reject FNUZ
          ("'arith.extf' op F8E5M2 and F8E4M3FN types are not supported on gfx942"), SPIR-V rejects
          f8 conversion, CUDA fails in LLVM translation. External int8 parameters with the decode
          in the graph compile everywhere; on cpu IREE fuses the decode into the matmul, so a
          decode step reads 1 byte per weight.
Declines: written buffers, excluded names, tables without the embeddings option, and (software
          decode) weights beyond 1e5 in magnitude, each with its reason in the stats.
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import Requires, register_pass
from llmc.passes._quantized_weights import Codec, QuantizedWeightsPass, quantize_rows, register_codec

_aten = torch.ops.aten
FN_MAX = 448.0
SCALE_SUFFIX = "_fp8_scale"  # the scale of weight W is the buffer W + SCALE_SUFFIX
NATIVE = ("e4m3fn", "e4m3fnuz")


def quantize(w: torch.Tensor, per_channel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 bits of E4M3FN codes, f32 scale [rows, 1] or [1, 1]) with w ~= decode(bits) * scale.

    Works through the rows in blocks of about 2^24 elements (_quantized_weights.quantize_rows), so
    the f32 temporaries stay near 64 MB whatever the weight."""
    return quantize_rows(w, per_channel, FN_MAX, lambda x: x.to(torch.float8_e4m3fn).view(torch.int8))


def fn_to_fnuz(bits: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same numbers as E4M3FNUZ codes: identical bits (an FNUZ code's value is half the FN code's:
    exponent bias 8 instead of 7), the scale doubled; FN's -0 (0x80, FNUZ's NaN) becomes +0. FN's NaN
    codes (0x7F, 0xFF) would read as +-240: the quantizer never writes them."""
    return torch.where(bits == -128, torch.zeros_like(bits), bits), scale * 2


def decode_sw(bits: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """E4M3FN codes (int8 bits) to their values with integer ops and one multiply (exact).

    The sign goes to an f32's sign bit and the 7 exponent+mantissa bits to the top of its exponent
    and mantissa fields: read as f32 that is the code's value times 2^-120 (exponent bias 127 vs 7),
    subnormal codes included (they become f32 subnormals, which IEEE arithmetic scales exactly).
    (An f16 construction with 16-bit lanes measured slower on cpu: IREE's f16 -> f32 widening.)
    """
    return (decode_bits(bits) * 2.0**120).to(dtype)


def decode_bits(bits: torch.Tensor) -> torch.Tensor:
    """E4M3FN codes (int8 bits) to value x 2^-120 in f32: the integer part of decode_sw, which the cpu
    graph (_emit_decode_bits) and its C kernel compute, the 2^120 left to the scale."""
    b = bits.to(torch.int32)
    return (((b & 0x80) << 24) | ((b & 0x7F) << 20)).view(torch.float32)


def decode_native(bits: torch.Tensor, flavour: str, dtype) -> torch.Tensor:
    f8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[flavour]
    return bits.view(f8).to(dtype)


def _emit_decode_bits(graph, bits_node):
    """E4M3FN codes (int8) to value x 2^-120 in f32 with 3 integer ops: the code shifted to the top
    byte of an i32, shifted back arithmetically by 4 (the sign fills bits 27..31, the 7
    exponent+mantissa bits land at 20..26) and masked with 0x87F00000; read as f32 that is value x
    2^-120, the 2^120 folded into the row's scale (the codec's factor). The shift up makes it
    independent of how the backend widens i8 (sign- or zero-extension: a form that relied on sign
    extension was right on cpu and wrong on IREE's SPIR-V path)."""
    call = graph.call_function
    b = call(_aten._to_copy.default, (bits_node,), {"dtype": torch.int32})
    top = call(_aten.__lshift__.Scalar, (b, 24))
    return call(_aten.view.dtype, (call(_aten.bitwise_and.Scalar, (call(_aten.__rshift__.Scalar, (top, 4)), -0x78100000)), torch.float32))


_packed.define_kernel_op("fp8", decode_bits)
_packed.define_gemm_op("fp8", decode_bits)


def _decode_pair_bits(p: torch.Tensor) -> torch.Tensor:
    """decode_bits of codes in the pair layout (passes/_packed.py pack_pairs), in the plain layout's order."""
    return decode_bits(_packed.pairs_to_groups(p))


_packed.define_kernel_op("fp8dp", _decode_pair_bits)
_packed.define_gemm_op("fp8dp", _decode_pair_bits)
FP8 = register_codec(Codec(dtype="fp8", option="fp8", scale_suffix=SCALE_SUFFIX, quantize=quantize, decode=decode_sw,
                           emit_bits=_emit_decode_bits, factor=2.0**120, form="software"))


@register_pass("fp8-weights", Requires(dtypes=("fp8",)))
class Fp8WeightsPass(QuantizedWeightsPass):
    codec = FP8

    def native(self) -> str | None:
        flavour = self.ctx.arch.fp8
        return flavour if flavour in NATIVE else None

    def encode(self, tensor, per_channel, native):
        bits, scale = quantize(tensor, per_channel)
        return fn_to_fnuz(bits, scale) if native == "e4m3fnuz" else (bits, scale)

    def decline_scale(self, scale, native):
        if native is None and float(scale.max()) * 2.0**120 > torch.finfo(torch.float32).max:
            return "weights beyond 1e5 in magnitude (the decode's scale x 2^120 overflows f32)"
        return None

    @staticmethod
    def emit_native(graph, bits_node, scale_node, native, compute):
        """The codes viewed as the arch's E4M3 flavour and widened to the compute dtype, times the scale."""
        call = graph.call_function
        f8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[native]
        value = call(_aten._to_copy.default, (call(_aten.view.dtype, (bits_node, f8)),), {"dtype": compute})
        s = call(_aten._to_copy.default, (scale_node,), {"dtype": compute}) if compute != torch.float32 else scale_node
        return call(_aten.mul.Tensor, (value, s))
