"""int8-weights: linear weights quantized to int8 (symmetric, per output channel), decoded where used.

Matches:  with `--dtype int8`, every floating 2-D parameter of the exported program that feeds a
          matrix product (aten.mm / addmm / bmm / matmul / linear, through views and transposes): the
          linear layers, and an embedding table tied to the output head. Other embedding tables are
          left alone unless the `quant_embeddings` option is set (set by `llmc compile --dtype int8`
          unless --no-quant-embeddings: compiler/lower.py EMBEDDINGS_BY_DEFAULT); parameters
          matching a `quant_exclude` pattern (--quant-exclude, fnmatch on the stored name, e.g.
          `lm_head.*`) and written buffers are left alone, with the reason in the stats.
Produces: per output channel (row) s = amax|w_row| / 127 (1 for an all-zero row), q = round(w / s)
          (half to even) clamped to [-127, 127], stored as an int8 parameter; s is an f32 buffer
          `<name>_int8_scale` ([rows, 1]). Where the weight was used:
              w' = f32(q) * s     then cast to the compute dtype (f32 on cpu, f16 on GPUs and SPIR-V)
          On cpu every weight a matrix product reads is stored packed, P[ceil(N/8), K, 8], and a
          one-row product (a decode step's linear) becomes
              (x.view(1, K/4, 4, 1) * f32(P).view(N/8, K/4, 4, 8)).sum(1).sum(1).view(1, N) * s.T
          with the scale applied after the sum; multi-row uses read f32(P) * s unpacked to [N, K]; a
          tied table's embedding gathers its rows' codes from P (passes/_packed.py). The pass body
          is fp8-weights' (passes/_quantized_weights.py); this file gives the int8 codec.
Safe because: |q| <= 127 and f32 holds every int8 exactly, so the program computes with exactly
          decode(q) * s, which is within s / 2 of each weight (the round-to-nearest error; the
          clamp never cuts: |w / s| <= 127 by the choice of s). The scale is applied in f32 before
          any cast to f16 (a small row's scale would be an f16 subnormal). -128 is never written, so
          the code range is symmetric and a row's largest weight is exact up to f32 rounding.
Declines: written buffers, excluded names and tables without `quant_embeddings`, each with its
          reason in the stats (nothing else: every finite weight has a code).
Why: a decode step of an LLM reads every weight once, so its time is the weights' bytes: 1 byte per
          weight (and 4 per row) instead of 4 (f32) or 2 (f16). int8 keeps 7 bits of each row's range
          where E4M3 keeps 3 mantissa bits, so for weights of similar size in a row it is several
          times closer to the original than fp8 (docs/targets.md). No int8 arithmetic: the weights
          are converted where they are read, which every IREE backend lowers (an int8 -> float
          conversion, fused into the matmul's or the reduction's dispatch).
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import Requires, register_pass
from llmc.passes._quantized_weights import Codec, QuantizedWeightsPass, quantize_rows, register_codec

_aten = torch.ops.aten
QMAX = 127.0
SCALE_SUFFIX = "_int8_scale"  # the scale of weight W is the buffer W + SCALE_SUFFIX


def quantize(w: torch.Tensor, per_channel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, f32 scale [rows, 1] or [1, 1]) with |w - decode(codes) * scale| <= scale / 2."""
    return quantize_rows(w, per_channel, QMAX, lambda x: torch.round(x).to(torch.int8))


def decode(codes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """int8 codes to their values (exact in f32 and f16)."""
    return codes.to(dtype)


def _emit_decode_bits(graph, codes_node):
    """int8 codes to f32: one conversion (sitofp after IREE's lowering), fusable into its consumer."""
    return graph.call_function(_aten._to_copy.default, (codes_node,), {"dtype": torch.float32})


_packed.define_kernel_op("int8", decode)
_packed.define_gemm_op("int8", decode)
INT8 = register_codec(Codec(dtype="int8", option="quant", scale_suffix=SCALE_SUFFIX, quantize=quantize, decode=decode,
                            emit_bits=_emit_decode_bits, factor=1.0, form="int8"))


@register_pass("int8-weights", Requires(dtypes=("int8",)))
class Int8WeightsPass(QuantizedWeightsPass):
    codec = INT8
