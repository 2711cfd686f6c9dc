"""decompose-attention: scaled_dot_product_attention written out for IREE's llvm-cpu and SPIR-V backends.

Matches:  every `aten.scaled_dot_product_attention` in the exported program, on targets whose
          attention mode is "decompose" (llvm-cpu, vulkan, xpu). hip and cuda keep SDPA whole: IREE
          forms its fused attention op from it (this pass is skipped there).
Produces, per call:
  - "decode" form, for one query row against keys/values of any length (a decode step):
        q [B, Hq, 1, D], k/v [B, Hk, L, D], G = Hq / Hk query heads per KV head
        scores[B, Hk, G, L] = sum_D(q as [B, Hk, G, 1, D] * k as [B, Hk, 1, L, D]) * scale + mask
        out = sum_L(softmax(scores) as [.., L, 1] * v as [B, Hk, 1, L, D]) -> [B, Hq, 1, D]
    all in f32, as multiply + sum reductions, with no batch matmul and no expanded KV cache;
  - "half-matmul" form, on SPIR-V targets for f16 q/k/v (prefill and decode alike):
        scores = (q * scale as [B, Hk, G*S, D]) @ k^T   in f16 (IREE accumulates in f32)
        p = softmax(scores in f32 + mask) -> f16;  out = p @ v  in f16 -> [B, Hq, S, D]
    no f16 -> f32 conversion of q, k or v before a contraction;
  - "causal" form, on llvm-cpu for a causal f32 call with no other mask (a prefill):
        scores[B, Hk, G, S, L] = ((q * scale) as [B, Hk, G*S, D]) @ k^T     (no copy of k/v per head)
        m = max_L(scores where j <= i else -inf);  e = 2^((scores - m) * log2(e)) where j <= i else 0
        out = (e / sum_L(e)) as [B, Hk, G*S, L] @ v -> [B, Hq, S, D]
    the mask applied inside the two consumers instead of written into the scores;
  - "masked" form, on llvm-cpu for an f32 call with a bool mask [B or 1, 1, S or 1, L] (a prefill
    chunk after cached positions, LlamaPrefillChunk): the causal form with `keep` in place of j <= i,
    and a row that keeps no key gives 0 (sum_L(e) clamped to the smallest normal f32), as PyTorch's
    math SDPA does;
  - "general" form, for everything else (float masks, dropout, f16 on cpu): torch-mlir's own
    decomposition (matmul, additive float mask, softmax, matmul), which keeps PyTorch's masking
    semantics exactly.
Safe because: all forms compute softmax(q k^T * scale + mask) v as PyTorch defines it; the decode
    form accumulates in f32 (at least eager's precision) and casts back to q's dtype. A bool mask is
    applied as "keep where True"; a float mask is added. The causal form's mask is PyTorch's (top-left
    aligned: query i sees keys 0..i), so key 0 is kept in every row and m is finite; 2^(x log2 e) is
    e^x to f32 rounding; masked entries are exactly 0, as softmax makes them.
Why: IREE 3.13's SPIR-V backend cannot compile its fused attention op at all ("'iree_linalg_ext.
    online_attention' op result #0 must be variadic of ranked tensor ..., but got 'memref<...>'",
    tiny Llama, --iree-vulkan-target=llvmpipe). On llvm-cpu the fused op runs ~9x slower than the
    decomposed form, and a decode step's
    attention as a batch matmul whose reduction dim is the dynamic cache length crashes IREE's data
    tiling ("'affine.delinearize_index' op no basis element may be statically non-positive"); a
    decode step is a matrix-vector product that gains nothing from tiling anyway.
    The causal form: with a dynamic sequence length IREE 3.13 compiled torch's decomposition into a
    `linalg.softmax` it did not vectorize (2.5 ms a layer for 12 x 128 x 128 scores, against 0.45 ms
    at a static length) and a causal-mask dispatch over the scores collapsed to one dimension, which
    recovers (i, j) with a 64-bit division and remainder per element (0.87 ms a layer). Written with
    exp2 the softmax is not raised to `linalg.softmax` and becomes two vectorized reductions; the mask,
    applied separately in the max and in the exponent (two ops, not one shared one), fuses into each
    instead of being a dispatch of its own. small-125m f32 prefill of 128 tokens, 1 thread: 295-306
    vs 337-344 ms a call (dynamic), 259-260 vs 265-266 (bucket 128) (docs/targets.md).
    The half-matmul form routes around an IREE 3.13 SPIR-V bug: converting q to f32 right after
    RoPE (as the other forms and torch's own decomposition do) makes IREE clone RoPE's gather into
    the attention matmul's dispatch, which then fails to compile for subgroup-size-8 targets
    (lavapipe): "failed to legalize operation 'memref.alloc' ... memref<16xindex,
    #spirv.storage_class<Workgroup>>". Keeping the matmuls in f16 (as GPU attention kernels do:
    f16 operands, f32 accumulation, softmax in f32) leaves no conversion to clone.
"""

from __future__ import annotations

import math

import torch

from llmc.passes._base import DecompositionPass, Requires, register_pass

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _gqa_refusal(q, k, v, dropout_p) -> str | None:
    """What both rewritten forms need: 4-d q/k/v, no dropout, whole groups of query heads per KV
    head, one batch size (None when the call has all of it)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not 4-d [B, H, S, D]"
    if dropout_p != 0.0:
        return "dropout"
    hq, hk = q.shape[1], k.shape[1]
    if not isinstance(hq, int) or not isinstance(hk, int) or hk == 0 or hq % hk:
        return "query heads not a multiple of KV heads"
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        return "batch dims differ"
    return None


def _decode_form_refusal(q, k, v, attn_mask, dropout_p, is_causal) -> str | None:
    """Why the decode form does not apply to this call (None when it does)."""
    if q.dim() == 4 and (not isinstance(q.shape[2], int) or q.shape[2] != 1):
        return "more than one query row"
    if is_causal:
        return "is_causal with one query row (PyTorch aligns the causal mask top-left)"
    return _gqa_refusal(q, k, v, dropout_p)


def _half_matmul_refusal(q, k, v, attn_mask, dropout_p, is_causal) -> str | None:
    """Why the half-matmul form does not apply to this call (None when it does)."""
    if q.dtype != torch.float16 or k.dtype != torch.float16 or v.dtype != torch.float16:
        return "not f16"
    why = _gqa_refusal(q, k, v, dropout_p)
    if why is None and attn_mask is not None and (attn_mask.dim() != 4 or attn_mask.shape[1] not in (1, q.shape[1])):
        return "mask not [B or 1, 1 or Hq, S, L]"
    return why


def half_matmul_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v with f16 matmuls, f32 softmax, grouped-query heads folded into rows."""
    b, hq, s, d = q.shape
    hk, length, dv = k.shape[1], k.shape[2], v.shape[-1]
    g = hq // hk
    scale = d**-0.5 if scale is None else scale
    qg = (q * scale).reshape(b, hk, g * s, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float().reshape(b, hk, g, s, length)
    if is_causal:  # PyTorch aligns the causal mask top-left: query i sees keys 0..i
        keep = torch.arange(length, device=q.device).unsqueeze(0) <= torch.arange(s, device=q.device).unsqueeze(1)
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.shape[1] == 1:
            mask = attn_mask.unsqueeze(1)  # [B or 1, 1, 1, S or 1, L] broadcasts as it is
        else:
            mask = attn_mask.expand(b, hq, s, length).reshape(b, hk, g, s, length)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask.float()
    p = torch.softmax(scores, dim=-1).to(q.dtype).reshape(b, hk, g * s, length)
    return torch.matmul(p, v).reshape(b, hq, s, dv)


def _causal_form_refusal(q, k, v, attn_mask, dropout_p, is_causal) -> str | None:
    """Why the causal form does not apply to this call (None when it does): f32, and either is_causal
    with no other mask, or a bool mask [B or 1, 1, S or 1, L] without is_causal."""
    if q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32:
        return "not f32"
    if is_causal and attn_mask is not None:
        return "a mask besides is_causal"
    if not is_causal:
        if attn_mask is None:
            return "no mask"
        if attn_mask.dtype != torch.bool:
            return "a float mask"
        if attn_mask.dim() != 4 or attn_mask.shape[1] != 1:
            return "mask not [B or 1, 1, S or 1, L]"
    return _gqa_refusal(q, k, v, dropout_p)


LOG2_E = 1.4426950408889634


def causal_attention(q, k, v, scale, keep=None):
    """softmax(q k^T * scale + mask) v in f32, grouped-query heads folded into rows, softmax as exp2 with
    the mask applied in the max and in the exponent (see the module docstring). keep: a bool mask
    [B or 1, 1, S or 1, L] (True = attend); None: PyTorch's causal mask (top-left aligned)."""
    b, hq, s, d = q.shape
    hk, length, dv = k.shape[1], k.shape[2], v.shape[-1]
    g = hq // hk
    qg = (q * scale).reshape(b, hk, g * s, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).reshape(b, hk, g, s, length)
    if keep is None:
        # PyTorch aligns the causal mask top-left: query i sees keys 0..i
        hide = torch.arange(length, device=q.device).unsqueeze(0) > torch.arange(s, device=q.device).unsqueeze(1)
    else:
        hide = keep.logical_not().unsqueeze(1)  # [B or 1, 1, 1, S or 1, L] broadcasts over the G query heads
    m = scores.masked_fill(hide, float("-inf")).amax(-1, keepdim=True)
    e = torch.exp2(((scores - m) * LOG2_E).masked_fill(hide, float("-inf")))
    total = e.sum(-1, keepdim=True)
    if keep is not None:
        # a row that keeps no key: every e is 0 (m = -inf is masked out of the exponent); PyTorch's math
        # SDPA returns 0 there, and so does 0 / tiny
        total = total.clamp_min(torch.finfo(torch.float32).tiny)
    p = (e / total).reshape(b, hk, g * s, length)
    return torch.matmul(p, v).reshape(b, hq, s, dv)


def _static_scale(q, scale):
    """(q, scale) with scale a Python float: a symbolic head dim's 1/sqrt(D) is applied to q as a 0-d
    tensor instead (torch's math form takes it as Python arithmetic on the size (sym_float, pow),
    which torch-mlir's importer cannot take: "Unsupported builtin function for symbolic types:
    <built-in function pow>")."""
    if scale is not None:
        return q, scale
    if isinstance(q.shape[-1], int):
        return q, 1.0 / math.sqrt(q.shape[-1])  # as torch's math SDPA computes it
    return q * torch.rsqrt(torch.scalar_tensor(q.shape[-1], dtype=torch.float32)).to(q.dtype), 1.0


def decode_attention(q, k, v, attn_mask=None, scale=None):
    """softmax(q k^T * scale + mask) v for q with one row, grouped-query, as f32 multiply + sum."""
    b, hq, _, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    length = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, hk, g, 1, d).float()
    scores = (qg * k.float().unsqueeze(2)).sum(-1) * scale  # [B, Hk, G, L]
    if attn_mask is not None:
        if attn_mask.dim() == 4 and attn_mask.shape[1] == 1 and attn_mask.shape[2] == 1:
            mask = attn_mask  # [B or 1, 1, 1, L] broadcasts over [B, Hk, G, L] as it is: no copy
        else:
            mask = attn_mask.expand(b, hq, 1, length).reshape(b, hk, g, length)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask.float()
    # softmax, written out so that a row whose every key is masked gives 0 as PyTorch's SDPA does (torch
    # 2.13, bool and float masks): its max -inf is clamped to f32's lowest, so every exponent is
    # e^-inf = 0, and 0 / tiny = 0 (torch.softmax gives 0 / 0 = NaN there)
    m = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    e = torch.exp(scores - m)
    p = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    o = (p.unsqueeze(-1) * v.float().unsqueeze(2)).sum(-2)  # [B, Hk, G, D]
    return o.to(q.dtype).reshape(b, hq, 1, v.shape[-1])


@register_pass("decompose-attention", Requires(attention="decompose"))
class DecomposeAttentionPass(DecompositionPass):
    def decompositions(self) -> dict:
        from torch_mlir.extras.fx_decomp_util import get_decomposition_table

        table = get_decomposition_table()
        general = table[SDPA]

        spirv = self.ctx.caps.backend == "vulkan-spirv"

        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            if spirv and _half_matmul_refusal(q, k, v, attn_mask, dropout_p, is_causal) is None:
                self.rewrote_here("half-matmul")
                return half_matmul_attention(q, k, v, attn_mask, is_causal, scale)
            if _decode_form_refusal(q, k, v, attn_mask, dropout_p, is_causal) is None:
                self.rewrote_here("decode")
                return decode_attention(q, k, v, attn_mask, scale)
            if not spirv and _causal_form_refusal(q, k, v, attn_mask, dropout_p, is_causal) is None:
                self.rewrote_here("causal" if is_causal else "masked")
                q, scale = _static_scale(q, scale)
                return causal_attention(q, k, v, scale, None if is_causal else attn_mask)
            self.rewrote_here("general")
            if scale is None and not isinstance(q.shape[-1], int):
                q, scale = _static_scale(q, scale)
            return general(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

        # The general form goes through PyTorch's math kernels (e.g. _scaled_dot_product_flash_attention_for_cpu),
        # which torch-mlir's table decomposes further: keep those entries with ours.
        out = {k: v for k, v in table.items() if "scaled_dot_product" in str(k)}
        out[SDPA] = sdpa
        return out
