"""chunk-attention-kernel: a prefill chunk's attention over the KV cache as one call of llmc's C kernel.

Matches:  on llvm-cpu where llmc's C kernels serve the target (compiler/ukernels.py `unavailable`, passed
          in ctx.options by compiler/pipeline.py, as for decode-attention-kernel),
          every `aten.scaled_dot_product_attention(q, k, v, mask)` with
            q [1, Hq, C, D] f32, C > 1 static (the query rows of a prefill chunk), no dropout, not causal;
            k, v the first L rows of caches kc, vc [1, Hk, Cm, D] f32 (`aten.slice[_copy](kc, 2, 0, L)`, or
              the whole cache), or those rows of bf16 caches widened to f32 (--kv-dtype bf16), as
              decode-attention-kernel takes them; Hq a multiple of Hk, at most 8 query heads per KV head,
              D a multiple of 16 with 8 (Hq / Hk) D <= 4096 (the kernel's stack arrays);
            mask a bool [1, 1, C, L] (True: attend; llmc's LlamaPrefillChunk: causal and padding) or an
              additive f32 one of that shape.
Produces: `llmc::attn_chunk(q * scale, kc, vc, bias) -> [1, Hq, C, D]`, bias the f32 [1, 1, C, L] of 0 and
          -inf a bool mask stands for (one per mask, shared by every layer), which compiler/ukernels.py
          makes a dispatch of `llmc_attn_chunk` (`llmc_attn_chunk_bf16` over a bf16 cache;
          compiler/csrc/matvec_x86_64.c): a workgroup per KV head and block of 8 or 16 query positions, its
          query heads' rows scored against each block of 64 cache rows in registers, the softmax kept
          online, the rows after L never read. Eager, the op is the same arithmetic in torch.
Safe because: the kernel computes softmax(q k^T * scale + bias) v over rows 0..L-1 in f32 as PyTorch's
          math attention defines it (f32 products summed over D, the exponential within 2^-23 relative
          as the decode kernel's, f32 sums over L), and a row whose every key is masked gives 0, as
          PyTorch's SDPA does (torch 2.13 on cpu) and decompose-attention's masked form does. A bool mask
          is exactly the additive 0 / -inf bias. A bf16 cache's rows are widened exactly as they are read.
Why: decompose-attention's masked form leaves a long prompt's chunks with the scores written out and
          read back by IREE 3.13 between six dispatches (the score matmul's unpack, a masked max that
          recomputes the mask from its i64 inputs per score, the exponentials, the sums and division, the
          weights' pack for the second matmul, and the per-call packs of K and V): small-125m f32, a
          64-token chunk after 1984 cached rows, 1 thread, `iree-profile`: 88 of 183 ms in attention,
          48 ms of it in those passes over the scores. With the kernel: attention 104-115 -> 65-67 ms
          of a 208-224 -> 165-168 ms call (the two builds profiled in turn); a 2000-token prompt's
          prefill 1.13x (1 thread) and 1.21x (2) faster in f32 (docs/targets.md "Prefill-chunk
          attention kernel").
"""

from __future__ import annotations

import torch

from llmc.passes._base import Requires, register_pass
from llmc.passes.decode_attention_kernel import CacheAttentionKernelPass, _cache, _kernels_serve, cache_refusal, recorded_operands

_aten = torch.ops.aten
MAX_GROUP = 8  # compiler/csrc: CHUNK_MAX_ROWS / 8 (the least positions a workgroup takes)
MAX_ROWS_D = 4096  # compiler/csrc: CHUNK_ROWS_D (8 positions x query heads per KV head x D)
D_MULTIPLE = 16  # the output tile's columns


def rows_per_workgroup(g: int, d: int) -> int:
    """Query positions one workgroup takes: 16, or 8 where 16 would not fit the kernel's stack arrays
    (64 rows, 4096 rows x D; compiler/csrc/matvec_x86_64.c CHUNK_MAX_ROWS, CHUNK_ROWS_D)."""
    return 16 if g * 16 <= 8 * MAX_GROUP and g * 16 * d <= MAX_ROWS_D else 8


def shape_refusal(hq: int, hk: int, d: int) -> str | None:
    """Why the kernel cannot take these heads (None when it can)."""
    if hk < 1 or hq % hk or hq // hk > MAX_GROUP or d % D_MULTIPLE or d < D_MULTIPLE or 8 * (hq // hk) * d > MAX_ROWS_D:
        return (f"{hq} query heads on {hk}, head size {d} (the kernel: up to {MAX_GROUP} per KV head, a head size that "
                f"is a multiple of {D_MULTIPLE}, 8 x heads per KV head x head size <= {MAX_ROWS_D})")
    return None


@torch.library.custom_op("llmc::attn_chunk", mutates_args=())
def attn_chunk(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v over the first L = bias.shape[-1] rows of the caches, q already scaled:
    q [1, Hq, C, D], kc/vc [1, Hk, Cm, D], bias [1, 1, C, L] -> [1, Hq, C, D] (f32)."""
    _, hq, c, d = q.shape
    hk, length = kc.shape[1], bias.shape[-1]
    g = hq // hk
    k, v = kc[:, :, :length].float(), vc[:, :, :length].float()
    scores = torch.einsum("bhgcd,bhld->bhgcl", q.float().reshape(1, hk, g, c, d), k) + bias.float().reshape(1, 1, 1, c, length)
    # a row with every key masked gives 0 (as PyTorch's SDPA), not softmax's NaN
    top = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    e = torch.exp(scores - top)
    out = torch.einsum("bhgcl,bhld->bhgcd", e, v) / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return out.reshape(1, hq, c, d)


@attn_chunk.register_fake
def _(q, kc, vc, bias):
    return torch.empty_like(q, dtype=torch.float32)


def _refusal(node) -> str | None:
    """Why this SDPA call is not a prefill chunk's attention the kernel computes (None when it is)."""
    why, operands, vals = recorded_operands(node, "no mask")
    if why:
        return why
    (_, k, v, _), (tq, tk, tv, tm) = operands, vals
    if any(t.dtype != torch.float32 for t in (tq, tk, tv)):
        return "not f32"
    if tq.dim() != 4 or tq.shape[0] != 1 or not isinstance(tq.shape[2], int) or tq.shape[2] < 2:
        return "not a static block of query rows of batch 1"
    hq, c, d = tq.shape[1], tq.shape[2], tq.shape[3]
    why = cache_refusal(k, v, hq, d) or shape_refusal(hq, _cache(k).meta["val"].shape[1], d)
    if why:
        return why
    if tm.dtype not in (torch.bool, torch.float32):
        return f"a {tm.dtype} mask"
    if tm.dim() != 4 or tuple(tm.shape[:2]) != (1, 1) or str(tm.shape[2]) != str(c) or str(tm.shape[3]) != str(tk.shape[2]):
        return "mask not [1, 1, C, L] over the rows attended"
    if str(tv.shape[2]) != str(tk.shape[2]):
        return "k and v of different lengths"
    return None


@register_pass("chunk-attention-kernel", Requires(backends=("llvm-cpu",), check=_kernels_serve))
class ChunkAttentionKernelPass(CacheAttentionKernelPass):
    refusal = staticmethod(_refusal)

    def kernel_op(self):
        return torch.ops.llmc.attn_chunk.default

    def before_decomposing(self, program) -> None:
        self._biases = {}  # mask node -> its f32 bias node: one per mask, which every layer shares
        super().before_decomposing(program)

    def mask_arg(self, graph, mask):
        """A bool mask as the f32 bias of 0 and -inf it stands for (inserted once, after the mask); an f32 one as it is."""
        if mask.meta["val"].dtype != torch.bool:
            return mask
        if mask not in self._biases:
            with graph.inserting_after(mask):
                bias = graph.call_function(_aten.where.Scalar, (mask, 0.0, float("-inf")))
            bias.meta["val"] = torch.ops.aten.where.Scalar(mask.meta["val"], 0.0, float("-inf"))
            self._biases[mask] = bias
        return self._biases[mask]
