"""decompose-moe: the ops of a mixture-of-experts layer that torch-mlir cannot lower, written out.

transformers 5 runs a MoE layer's experts (Mixtral, Qwen-MoE, ...: `@use_experts_implementation`,
default "grouped_mm") as: sort the (token, expert) pairs by expert id, count the rows per expert
with `torch.histc`, take the running sum as group offsets, and multiply each group of rows by its
expert's weight with a grouped matrix product: `torch.nn.functional.grouped_mm` (exported as
`aten._grouped_mm`) where PyTorch allows it (bf16), else the custom op
`transformers::grouped_mm_fallback` (f32 under torch.export). torch-mlir 20261001 has no lowering
for any of the three ("failed to legalize operation 'torch.operator' that was explicitly marked
illegal: ... torch.aten.histc").

Matches:
  - `aten.histc(x, bins, min, max)`, x floating point, min < max given (the expert counts:
    bins = E, min = 0, max = E - 1 over the integer-valued expert ids as floats).
  - `aten._grouped_mm(x [S, K], w [E, K, N], offs [E])` and `transformers::grouped_mm_fallback`
    (same operands): rows offs[e-1] <= i < offs[e] (offs[-1] = 0) of x times w[e]; rows at or
    past offs[E-1] are not computed by either (eager leaves them uninitialized or zero).
  - `aten._grouped_mm(a [E, M, K], b [E, K, N])` without offs: a batch product.
Produces:
  - histc: pos = int((x - min) * bins / (max - min)) in x's dtype, the last bin taking x == max,
    elements outside [min, max] (and NaN) not counted; counts[b] = sum(valid & (pos == b)), as
    comparisons and one sum over the elements (form "histc").
  - grouped products, with e(i) = #{e : offs[e] <= i} the group of row i:
      "gather" when S is static and S <= E (a decode step: S = top_k rows):
          out[i] = sum_K(f32(x[i, :, None]) * f32(w[e(i)])) -> x's dtype, zero where i >= offs[-1]
          (each row reads only its own expert's weights; the gather fuses into the reduction).
      "dense" otherwise (prefill; any dynamic S):
          y = bmm(x expanded to [E, S, K], w) -> [E, S, N];  out[i] = y[e(i), i]
          selected with where(e(i) == e, y, 0) summed over E (exactly one nonzero term).
      "batched": torch.bmm(a, b).
Safe because: histc's formula is PyTorch's own (ATen's LINEAR_INTERPOLATION histogram kernel,
    which torch.histc uses: the same expression, evaluated in the input dtype, the same "last bin
    is closed" rule and the same filter), and a count of integer-valued expert ids is exact. Each
    grouped form computes, for every row, the product with its own group's weight: the gather form
    accumulates in f32 (at least eager's precision: ATen accumulates bf16 grouped products in f32
    and rounds once), the dense form selects each row's product with `where`, so another expert's
    product (even inf) never leaks into it. Rows past the last offset are zero, as the fallback op
    returns them. Both forms are correct for every shape torch.export leaves dynamic: S (tokens x
    top_k) may be symbolic; E, K and N are the weights' static sizes.
Why these forms: IREE has no grouped matmul with data-dependent group sizes, and the group sizes
    are data (the router's choices), so a static formulation either gathers each row's expert
    weights (sharktank's PreGatherFFNMOE: reads S weight matrices) or computes every expert for
    every row and selects (sharktank's DenseFFNMOE: reads E weight matrices, E times the FLOPs).
    Which is cheaper depends on S against E (as sharktank notes): a decode step's S = top_k rows
    read top_k of E experts in the gather form, while a prefill's S = tokens x top_k rows would
    gather S copies of a weight matrix, so above E rows, or with S unknown, the dense form bounds
    the cost at the whole weight tensor read once. Measured on cpu (f32, K = 1024, S = 2 rows,
    2 busy cores): E = 8, N = 2048: gather 18 ms, dense 28 ms; E = 32, N = 1024: gather 13 ms,
    dense 39 ms. IREE fuses the gather into the reduction (one "matvec_like" dispatch), but that
    dispatch is not at memory bandwidth yet (one static expert's matvec of the first shape:
    1.8 ms); a batch matmul of the gathered weights measured the same as the multiply + sum.
Refuses (PassError, one line): histc of an integer tensor or with min >= max (a range taken from
    the data), a grouped product with bias, 2-D x 2-D or 3-D x 2-D operands (groups along K or N),
    3-D x 3-D with offsets, operands of different dtypes, an out_dtype other than theirs or f32, or
    offsets that do not give one end per group.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, PassError, register_pass

_aten = torch.ops.aten


def _transformers_fallback():
    """transformers' grouped-product custom op, when transformers registered it (it is imported by
    whoever built the model; llmc never imports transformers)."""
    try:
        return torch.ops.transformers.grouped_mm_fallback.default
    except (AttributeError, RuntimeError):
        return None


def histc(x, bins: int = 100, min=0, max=0):
    """torch.histc(x, bins, min, max) for min < max, as comparisons and a sum."""
    if not x.is_floating_point():
        raise PassError(f"decompose-moe: aten.histc of {x.dtype} is not supported (PyTorch's CPU histc takes floating point only)")
    if not min < max:
        raise PassError(f"decompose-moe: aten.histc with min={min}, max={max}: a range taken from the data (min == max) is not supported; give an explicit min < max")
    dt = x.dtype
    flat = x.reshape(-1)
    full = lambda v: torch.full((), v, dtype=dt, device=x.device)  # noqa: E731  (the kernel's edges are in x's dtype)
    lo, hi = full(min), full(max)
    valid = (flat >= lo) & (flat <= hi)  # False for NaN, as the kernel's !(elt >= left && elt <= right)
    pos = (flat - lo) * full(bins) / (hi - lo)
    pos = torch.where(valid, pos, full(0)).to(torch.int64).clamp(max=bins - 1)  # x == max: the last bin
    hit = (pos.unsqueeze(1) == torch.arange(bins, device=x.device).unsqueeze(0)) & valid.unsqueeze(1)
    return hit.sum(0).to(dt)


def _group_of_rows(offs, rows):
    """e(i) = number of group ends <= i: row i's group, E for rows past the last offset."""
    i = torch.arange(rows, device=offs.device, dtype=offs.dtype)
    return (offs.unsqueeze(0) <= i.unsqueeze(1)).sum(1)


def _check_grouped(op: str, x, w, offs, bias=None, out_dtype=None) -> None:
    if bias is not None:
        raise PassError(f"decompose-moe: {op} with bias is not supported")
    if x.dim() != 2 or w.dim() != 3:
        offsets = "without" if offs is None else "with"
        raise PassError(f"decompose-moe: {op} of {x.dim()}-d x {w.dim()}-d operands {offsets} offsets is not supported; "
                        "only [S, K] x [E, K, N] with offsets, and [E, M, K] x [E, K, N] without")
    if offs is None or offs.dim() != 1 or offs.shape[0] != w.shape[0]:
        shape = None if offs is None else tuple(offs.shape)
        raise PassError(f"decompose-moe: {op}: offsets {shape} do not give one end per group of the [{', '.join(map(str, w.shape))}] weights")
    if x.dtype != w.dtype or not x.is_floating_point():
        raise PassError(f"decompose-moe: {op} of {x.dtype} x {w.dtype} operands is not supported (both the same float dtype)")
    if out_dtype is not None and out_dtype not in (x.dtype, torch.float32):
        raise PassError(f"decompose-moe: {op} with out_dtype {out_dtype} for {x.dtype} operands is not supported")


def gather_grouped_mm(x, w, offs, out_dtype=None):
    """out[i] = x[i] @ w[e(i)], each row reading only its own expert's weights, accumulated in f32."""
    rows, n_groups = x.shape[0], w.shape[0]
    acc = torch.promote_types(x.dtype, torch.float32)
    group = _group_of_rows(offs, rows)
    valid = group < n_groups
    wsel = w[group.clamp(max=n_groups - 1)]  # [S, K, N]
    y = (x.to(acc).unsqueeze(-1) * wsel.to(acc)).sum(-2)  # [S, N]
    y = torch.where(valid.unsqueeze(-1), y, torch.zeros((), dtype=acc, device=x.device))
    return y.to(out_dtype or x.dtype)


def dense_grouped_mm(x, w, offs, out_dtype=None):
    """out[i] = (x @ w[e])[i] for e = e(i): every expert's product of every row, each row's own selected."""
    rows, k = x.shape
    n_groups = w.shape[0]
    cdt = out_dtype or x.dtype
    y = torch.bmm(x.to(cdt).unsqueeze(0).expand(n_groups, rows, k), w.to(cdt))  # [E, S, N]
    group = _group_of_rows(offs, rows)
    own = group.unsqueeze(0) == torch.arange(n_groups, device=x.device).unsqueeze(1)  # [E, S]
    return torch.where(own.unsqueeze(-1), y, torch.zeros((), dtype=cdt, device=x.device)).sum(0)


@register_pass("decompose-moe")
class DecomposeMoePass(DecompositionPass):
    def decompositions(self) -> dict:
        def grouped(op: str, x, w, offs, bias=None, out_dtype=None):
            if offs is None and bias is None and x.dim() == 3 and w.dim() == 3 and x.dtype == w.dtype and out_dtype in (None, x.dtype):
                self.rewrote_here("batched")
                return torch.bmm(x, w)
            _check_grouped(op, x, w, offs, bias, out_dtype)
            rows = x.shape[0]
            if isinstance(rows, int) and rows <= w.shape[0]:
                self.rewrote_here("gather")
                return gather_grouped_mm(x, w, offs, out_dtype)
            self.rewrote_here("dense")
            return dense_grouped_mm(x, w, offs, out_dtype)

        def grouped_mm(x, w, offs=None, bias=None, out_dtype=None):
            return grouped("aten._grouped_mm", x, w, offs, bias, out_dtype)

        def counted_histc(x, bins=100, min=0, max=0):
            out = histc(x, bins, min, max)
            self.rewrote_here("histc")
            return out

        table = {_aten.histc.default: counted_histc, _aten._grouped_mm.default: grouped_mm}
        fallback = _transformers_fallback()
        if fallback is not None:

            def transformers_grouped_mm(input, weight, offs):  # noqa: A002  (the op's argument names)
                return grouped("transformers::grouped_mm_fallback", input, weight, offs)

            table[fallback] = transformers_grouped_mm
        return table
