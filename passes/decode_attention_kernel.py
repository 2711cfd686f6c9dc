"""decode-attention-kernel: a decode step's attention over the KV cache as one call of llmc's C kernel.

Matches:  on llvm-cpu where llmc's C kernels serve the target (compiler/ukernels.py `unavailable`, passed
          in ctx.options by compiler/pipeline.py),
          every `aten.scaled_dot_product_attention(q, k, v, bias)` with
            q [1, Hq, 1, D] f32 (one query row: a decode step), no dropout, not causal;
            k, v the first L rows of caches kc, vc [1, Hk, C, D] f32 (`aten.slice[_copy](kc, 2, 0, L)`, or the
              whole cache, L = C: the static decode), or those rows of bf16 caches widened to f32
              (`aten.to(slice(kc), f32)`: --kv-dtype bf16), Hq a multiple of Hk (grouped-query), D a
              multiple of 8 and at most 256, Hq / Hk at most 8;
            bias an additive f32 mask [1, 1, 1, L] (-inf: masked).
Produces: `llmc::attn_decode(q * scale, kc, vc, bias) -> [1, Hq, 1, D]` (kc, vc the caches in their own
          dtype), which compiler/ukernels.py makes a dispatch of `llmc_attn_decode` (a bf16 cache:
          `llmc_attn_decode_bf16`; compiler/csrc/matvec_x86_64.c): one workgroup per KV
          head, its G query heads scored against each cache row as it is read, the softmax kept
          online (a running maximum and sum), the rows after L never read. Eager, the op is the
          same arithmetic in torch, so a rewritten program still runs.
Safe because: the kernel computes softmax(q k^T * scale + bias) v over rows 0..L-1 as PyTorch's math
          attention defines it, in f32: scores are f32 dot products (8 partial sums per row), the
          softmax's exponentials come from a polynomial within 2^-23 of e^x relative (0 below -87,
          where f32 e^x is subnormal and IREE's workers flush it to 0 anyway), and a row whose every
          score is -inf gives 0, as PyTorch's SDPA does (torch 2.13 on cpu; decompose-attention's
          decode form gives NaN there). The cache rows the slice leaves out are the ones the kernel
          does not read. A bf16 cache's rows are widened to f32 as they are read, exactly as the
          graph's own widening (bf16 -> f32 is exact), so the kernel never reads the f32 copy the
          graph asked for, and reads half the bytes.
Why: passes/decompose-attention's decode form (multiply + sum reductions, which IREE 3.13 compiles
          into three dispatches) read the cache at 5-10 GB/s: small-125m's shape (12 query heads on
          4 KV heads, D = 64) took 55 us a layer at 140 cached rows and 0.9 ms at 4096, i.e. a 4096-
          token decode step of that model spent longer in attention (10.8 ms) than in streaming its
          weights. The kernel, alone in a C harness on the same machine: 14.8 us at 140 rows, 414 us at
          4096 (docs/targets.md "Decode attention kernel").
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, Requires, register_pass

_aten = torch.ops.aten
SDPA = _aten.scaled_dot_product_attention.default
MAX_HEAD_DIM = 256  # compiler/csrc: ATTN_MAX_D
MAX_GROUP = 8  # compiler/csrc: ATTN_MAX_G


@torch.library.custom_op("llmc::attn_decode", mutates_args=())
def attn_decode(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v over the first L = bias.shape[-1] rows of the caches, q already scaled:
    q [1, Hq, 1, D], kc/vc [1, Hk, C, D], bias [1, 1, 1, L] -> [1, Hq, 1, D] (f32)."""
    _, hq, _, d = q.shape
    hk, length = kc.shape[1], bias.shape[-1]
    g = hq // hk
    k, v = kc[:, :, :length].float(), vc[:, :, :length].float()
    scores = torch.einsum("bhgd,bhld->bhgl", q.float().reshape(1, hk, g, d), k) + bias.float().reshape(1, 1, 1, length)
    # a row with every key masked gives 0 (as PyTorch's SDPA), not softmax's NaN
    top = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    e = torch.exp(scores - top)
    out = torch.einsum("bhgl,bhld->bhgd", e, v) / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return out.reshape(1, hq, 1, d)


@attn_decode.register_fake
def _(q, kc, vc, bias):
    return torch.empty_like(q, dtype=torch.float32)


# ctx.options: why llmc's C kernels do not serve the target ("" when they do), set by compiler/pipeline.py
# from compiler/ukernels.py `unavailable` (passes import nothing of the compiler)
KERNEL_UNAVAILABLE_OPTION = "attention_kernel_unavailable"


def _kernels_serve(ctx) -> str | None:
    return ctx.options.get(KERNEL_UNAVAILABLE_OPTION, "the C kernels' availability was not checked") or None


def _operands(node) -> tuple:
    """(q, k, v, attn_mask, dropout_p, is_causal, scale) of an SDPA node, positional or keyword."""
    args = list(node.args) + [None] * (6 - len(node.args))
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    return (*(node.kwargs.get(n, a) for n, a in zip(names, args[:6])), node.kwargs.get("scale"))  # scale: keyword-only


def recorded_operands(node, no_mask: str):
    """(why, operands, values) of an SDPA node for the cache attention kernels: `why` is the reason they
    cannot take it whatever its shapes (dropout, causal, no mask: `no_mask`, no recorded values), else None
    with (q, k, v, mask) and their recorded values (shared by this pass and chunk-attention-kernel)."""
    q, k, v, mask, dropout, causal, _ = _operands(node)
    if dropout or causal:
        return "dropout or causal", None, None
    if mask is None:
        return no_mask, None, None
    vals = [getattr(n, "meta", {}).get("val") for n in (q, k, v, mask)]
    if any(t is None for t in vals):
        return "no shapes recorded", None, None
    return None, (q, k, v, mask), vals


def _refusal(node) -> str | None:
    """Why this SDPA call is not a decode step's attention the kernel computes (None when it is)."""
    why, operands, vals = recorded_operands(node, "no additive f32 mask")
    if why:
        return why
    (_, k, v, _), (tq, tk, tv, tb) = operands, vals
    if any(t.dtype != torch.float32 for t in vals):
        return "not f32"
    if tq.dim() != 4 or tq.shape[0] != 1 or tq.shape[2] != 1:
        return "not one query row of batch 1"
    hq, d = tq.shape[1], tq.shape[3]
    why = cache_refusal(k, v, hq, d)
    if why:
        return why
    hk = _cache(k).meta["val"].shape[1]
    if hq % hk or hq // hk > MAX_GROUP or d % 8 or d > MAX_HEAD_DIM:
        return f"{hq} query heads on {hk}, head size {d} (the kernel: a multiple of 8 up to {MAX_HEAD_DIM}, up to {MAX_GROUP} per KV head)"
    if tb.dim() != 4 or tuple(tb.shape[:3]) != (1, 1, 1) or str(tb.shape[3]) != str(tk.shape[2]) or str(tv.shape[2]) != str(tk.shape[2]):
        return "mask not an additive [1, 1, 1, L] row over the rows attended"
    return None


def cache_refusal(k, v, hq, d) -> str | None:
    """Why k and v (of a call with hq query heads of size d) are not the first rows of two KV caches the
    attention kernels read: [1, Hk, C, D], static, both f32 or both bf16 (None when they are)."""
    kc, vc = _cache(k), _cache(v)
    if kc is None or vc is None:
        return "k/v not the first rows of a cache"
    tkc, tvc = kc.meta.get("val"), vc.meta.get("val")
    if tkc is None or tvc is None or tkc.shape != tvc.shape or tkc.dim() != 4 or tkc.shape[0] != 1 or tkc.shape[3] != d:
        return "cache shapes"
    if tkc.dtype != tvc.dtype or tkc.dtype not in CACHE_DTYPES:
        return f"caches {tkc.dtype} and {tvc.dtype} (the kernel: both f32 or both bf16)"
    if not all(isinstance(s, int) for s in (hq, d, tkc.shape[1], tkc.shape[2])):
        return "dynamic head count, head size or cache rows"
    return None


SLICES = (_aten.slice.Tensor, _aten.slice_copy.Tensor)  # slice_copy: llmc's Llama decode (passes/slice_copy.py)
# dtype conversions as the exported graph holds them before decomposing (aten.to), or after (_to_copy, prims)
CONVERTS = (_aten.to.dtype, _aten._to_copy.default, torch.ops.prims.convert_element_type.default)
CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the caches the kernel reads (llmc_attn_decode, _bf16)


def _widened(node):
    """The bf16 tensor that `node` widens to f32 (a conversion and nothing else), or None."""
    if getattr(node, "op", None) != "call_function" or node.target not in CONVERTS:
        return None
    if node.target == _aten._to_copy.default and set(node.kwargs) - {"dtype"}:
        return None  # a layout, device or memory-format change too
    dtype = node.kwargs.get("dtype", node.args[1] if len(node.args) > 1 else None)
    src = node.args[0]
    src_val = getattr(src, "meta", {}).get("val")
    if dtype != torch.float32 or src_val is None or src_val.dtype != torch.bfloat16:
        return None
    return src


def _cache(node):
    """The cache whose first rows `node` is (a slice along dim 2 from 0, step 1, of the cache or of a
    bf16 cache widened to f32 after the slice), or node itself."""
    node = _widened(node) or node
    if getattr(node, "op", None) == "call_function" and node.target in SLICES:
        args = list(node.args) + [0, None, None, 1][len(node.args) - 1:]
        src, dim, start, _, step = args[:5]
        return src if dim == 2 and start in (0, None) and step in (1, None) else None
    return node


class CacheAttentionKernelPass(DecompositionPass):
    """Rewrites each SDPA call that `refusal` accepts into `op(q * scale, kc, vc, mask_arg)` on the whole
    caches, before the exported graph is decomposed (the decomposition retrace would turn the cache slices
    into tensors of their own, and decompose-attention owns SDPA's table entry). Subclasses: decode-
    attention-kernel, chunk-attention-kernel (passes/chunk_attention_kernel.py)."""

    @staticmethod
    def refusal(node) -> str | None:
        raise NotImplementedError

    def kernel_op(self):
        raise NotImplementedError

    def mask_arg(self, graph, mask):
        """The node the kernel takes for the call's mask (the mask itself here)."""
        return mask

    def decompositions(self) -> dict:
        return {}

    def before_decomposing(self, program) -> None:
        graph = program.graph_module.graph
        for node in list(graph.find_nodes(op="call_function", target=SDPA)):
            why = self.refusal(node)
            if why:
                self.stats.decline(node.name, why)
                continue
            q, k, v, mask, _, _, scale = _operands(node)
            scale = q.meta["val"].shape[3] ** -0.5 if scale is None else scale
            mask = self.mask_arg(graph, mask)
            with graph.inserting_before(node):
                qs = graph.call_function(_aten.mul.Scalar, (q, scale))
                qs.meta["val"] = q.meta["val"] * scale
                call = graph.call_function(self.kernel_op(), (qs, _cache(k), _cache(v), mask))
                call.meta["val"] = node.meta["val"]
                for key in ("stack_trace", "nn_module_stack"):
                    if key in node.meta:
                        call.meta[key] = qs.meta[key] = node.meta[key]
            node.replace_all_uses_with(call)
            graph.erase_node(node)
            for sliced in {k, v}:  # the cache slices, now read by nothing
                if sliced is not _cache(sliced) and not sliced.users:
                    graph.erase_node(sliced)
            self.stats.rewrite()
        graph.lint()
        program.graph_module.recompile()


@register_pass("decode-attention-kernel", Requires(backends=("llvm-cpu",), check=_kernels_serve))
class DecodeAttentionKernelPass(CacheAttentionKernelPass):
    refusal = staticmethod(_refusal)

    def kernel_op(self):
        return torch.ops.llmc.attn_decode.default
