"""sort-by-rank: `aten.sort`, `aten.topk` and `aten.kthvalue` as ranks counted by comparison, not IREE's in-place sort.

Matches:  every `aten.sort(x, dim, descending)`, `aten.topk(x, k, dim, largest, sorted)` and
          `aten.kthvalue(x, k, dim, keepdim)` in the exported program (any dtype, any rank, any
          size; a dynamic size too). A mixture-of-experts layer in transformers 5 picks each
          token's experts with topk and sorts the (token, expert) pairs by expert id
          (passes/decompose_moe.py).
Produces, along `dim` (moved last; n elements, i and j positions along it):
          before[i, j] = x[j] sorts strictly before x[i], or x[j] equals x[i] and j < i
          rank[i] = sum_j before[i, j]              (a permutation of 0..n-1)
          indices[r] = sum_i i * (rank[i] == r);  values = gather(x, indices)
          with "sorts before" as PyTorch orders: ascending by <, descending by >, NaN above
          every number (last ascending, first descending) and equal to another NaN;
          topk: the first k of the sort, descending when `largest` (always sorted, which
          `sorted=False` allows); kthvalue: element k-1 of the ascending sort. torch-mlir lowers
          kthvalue to a `tm_tensor.topk` that IREE 3.13 rejects ("'tm_tensor.topk' op region
          block must end with a linalg_ext.yield i1").
Safe because: the comparison is a strict weak order and ties are broken by position, so the ranks
          are a permutation and the result is the stable sort of x: one of the orders
          `torch.sort(stable=False)` may return, and the order eager's stable sort returns.
          The values are gathered, never computed, so they are x's own elements, NaN and -0.0
          included.
Why: torch-mlir lowers `aten.sort`, and `aten.topk` through a sort, to IREE's
          `iree_linalg_ext.sort`, which sorts an iota of indices in place; IREE 3.13 merges that
          iota with any equal iota of the program (an `arange`, another sort's) and then reads the
          sorted indices where the iota was meant (iree-org/iree#24665, open). transformers' MoE
          layer has both: `inv_perm[perm] = arange(S)` after `perm = sort(expert_ids)`, and one
          router `topk` of the same shape per layer. The tiny Mixtral (2 layers) compiled for cpu
          came back 0.08 off eager in bf16 (cosine 0.991; eager bf16 is within 0.004 of f32) and,
          with a dynamic sequence length, 0.04-0.08 off in f32. IREE's sort also orders NaN where
          its `<` puts it (between -0.0 and 0.0 in tests/passes/test_sort_by_rank_numerics.py
          without this pass; PyTorch sorts NaN last). The comparisons are elementwise
          ops and sums that IREE fuses; their n^2 work matches IREE's own sort (a bubble sort,
          iree-org/iree#6364) and runs in parallel. Measured on cpu (2 busy cores): a sort of 4096
          int64 ids (a 2048-token prefill's top-2 pairs) 24 ms, IREE's sort 37 ms; a top-50 of
          32000 logits 1.1 s, where IREE's failed to compile ("exceeded stack allocation limit of
          32768 bytes ... Got 128000 bytes").
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass


def _less(p, q):
    """p sorts strictly before q ascending: p < q, with NaN above every number."""
    if not p.is_floating_point():
        return p < q
    return (p < q) | (torch.isnan(q) & ~torch.isnan(p))


def _same(p, q):
    if not p.is_floating_point():
        return p == q
    return (p == q) | (torch.isnan(p) & torch.isnan(q))


def sort_by_rank(x, dim: int = -1, descending: bool = False):
    """(values, indices) of torch.sort(x, dim, descending), stable, from comparison counts."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    d = dim % x.dim()
    last = d == x.dim() - 1
    xt = x if last else x.movedim(d, -1)  # [..., n]
    keys = xt.to(torch.uint8) if xt.dtype == torch.bool else xt
    n = xt.shape[-1]
    a, b = keys.unsqueeze(-1), keys.unsqueeze(-2)  # element i along -2, element j along -1
    first = _less(a, b) if descending else _less(b, a)  # x[j] strictly before x[i]
    pos = torch.arange(n, device=x.device)
    earlier = pos.unsqueeze(0) < pos.unsqueeze(1)  # [n, n]: j < i
    rank = (first | (_same(a, b) & earlier)).sum(-1)  # [..., n]
    at = rank.unsqueeze(-2) == pos.unsqueeze(-1)  # [..., r, i]: rank[i] == r
    indices = torch.where(at, pos, torch.zeros((), dtype=torch.int64, device=x.device)).sum(-1)
    values = torch.gather(xt, -1, indices)
    if last:
        return values, indices
    return values.movedim(-1, d), indices.movedim(-1, d)


def topk_by_rank(x, k: int, dim: int = -1, largest: bool = True):
    """(values, indices) of torch.topk(x, k, dim, largest, sorted=True): the first k of the sort."""
    values, indices = sort_by_rank(x, dim, descending=largest)
    if x.dim() == 0:
        return values, indices
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def kthvalue_by_rank(x, k: int, dim: int = -1, keepdim: bool = False):
    """(values, indices) of torch.kthvalue(x, k, dim, keepdim): element k-1 of the ascending sort."""
    values, indices = sort_by_rank(x, dim)
    if x.dim() == 0:
        return values, indices
    values, indices = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    if keepdim:
        return values, indices
    return values.squeeze(dim), indices.squeeze(dim)


@register_pass("sort-by-rank")
class SortByRankPass(DecompositionPass):
    def decompositions(self) -> dict:
        def sort(x, dim=-1, descending=False):
            self.rewrote_here("sort")
            return sort_by_rank(x, dim, descending)

        def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002  (the op's argument name)
            self.rewrote_here("topk")
            return topk_by_rank(x, k, dim, largest)

        def kthvalue(x, k, dim=-1, keepdim=False):
            self.rewrote_here("kthvalue")
            return kthvalue_by_rank(x, k, dim, keepdim)

        return {torch.ops.aten.sort.default: sort, torch.ops.aten.topk.default: topk, torch.ops.aten.kthvalue.default: kthvalue}
