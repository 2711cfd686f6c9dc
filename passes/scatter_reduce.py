"""scatter-reduce: the scatters IREE gets wrong or crashes on, as scatters it runs right.

Matches:  `aten.scatter_reduce.two(self, dim, index, src, reduce, include_self)` without self (any
          reduce), with self where the dtype or reduce needs it (below), with a negative dim or 0-d;
          `aten.scatter_add`, `aten.scatter.src` and `aten.scatter.value` with a negative dim, a 0-d
          self, or (scatter_add) bool; `aten.scatter.reduce` / `.value_reduce` (scatter with
          reduce="add" / "multiply"). In-place and `.out` forms reach the pass as these
          (run_decompositions functionalizes them).
Produces, with d = dim % self.dim() (every scatter the pass writes has a non-negative dim):
          without self (eager's own algorithm, ATen's scatter_reduce_two): every position the index
              hits set to the identity, 0 (sum), 1 (prod), -inf / the dtype's lowest (amax), +inf /
              highest (amin), then the reduction with self:
              scatter_reduce.two(scatter.value(self, d, index, identity), d, index, src, reduce)
          mean without self, and integer mean with self (eager's algorithm too):
              total = the sum as above (with self: scatter_reduce "sum" of self), count =
              scatter_add(zeros_like(self), or ones_like with self, d, index, ones_like(src)) in self's
              dtype, 0 -> 1, then total / count; for integers floor division (8- and 16-bit in int32:
              torch-mlir cannot lower their floor division, and int32 holds every quotient)
          bool (with or without self): in int8 with sum -> amax ("any"), prod -> amin ("all"), cast
              back; bool scatter_add likewise as amax with self ("or", as eager)
          uint8 amax / amin (with or without self): in int16, cast back
          scatter(self, d, index, src or value, reduce="add" / "multiply"): scatter_reduce.two with
              self, "sum" / "prod" (a value as a tensor of index's shape in self's dtype, as eager)
          a negative dim otherwise: the same call with d; a 0-d self, index and src: the call on
              their [1] reshapes, reshaped back.
          These re-call the scatter ops; the table's entries return NotImplemented for the calls they
          leave (below), which keeps the call as it is: no recursion.
Declines (not counted: NotImplemented): scatter_reduce with self and a non-negative dim (sum,
          prod, amax, amin and float mean; not bool, nor uint8 amax / amin), and scatter_add,
          scatter.src and scatter.value with a non-negative dim (bool scatter_add excepted):
          torch-mlir lowers them to IREE's scatter, which compiles them, static and dynamic, and
          computes them as eager.
Safe because: each form is eager's own computation step by step. The identity changes no
          reduction (max(-inf, x) = x, 0 + x, 1 * x; integer lowest / highest likewise), so the
          scatter with self reduces exactly src's values into the positions the index hits; positions
          nothing hits keep self's value bit for bit (mean: divided by 1, -0.0 and NaN included).
          Integer sums and products wrap as eager's; float ones round in IREE's order. Bools as 0 / 1
          in int8 and uint8 in int16 compare as eager's; dim % self.dim() names the same dim.
Why: torch-mlir lowers a scatter to `tm_tensor.scatter` (IREE's `iree_linalg_ext.scatter`) with a
          reduction region, and IREE 3.13 fails or crashes on some: without self and with a dynamic
          shape, "'memref.alloca' op expected no unbounded stack allocations" (torch-mlir's e2e
          ScatterReduce{Float,Int}{Sum,Prod,Max,Min,Mean}Module); with a negative dim iree-compile is
          killed by SIGSEGV in torch-mlir's convertTorchScatterIndexAndSrcToTMScatterIndexAndSrc (any
          scatter, static shapes too); a 0-d scatter: "'iree_linalg_ext.scatter' op dimension map
          must have at least one element". Wrong values: integer mean with self rounds towards zero
          (eager floors: -7 / 2 = -4), bool sum and scatter_add add i1 (true + true = false; eager:
          true), uint8 amax / amin compare signed (200 < 100). torch-mlir has no lowering for
          scatter with reduce= (`scatter.value_reduce`: "failed to legalize operation
          'torch.operator'"; `scatter.reduce` reaches iree-compile as it is: "failed to legalize
          operation 'torch.constant.int'"). The forms cost one or two scatters more than IREE's own:
          a [4096, 64] index into 1000 rows, amax without self, dynamic, 10-18 ms on a busy 2-core cpu
          where the same scatter with self takes 6-7 ms and a one-hot mask form (index.numel() *
          self.size(d) compares; this pass's first version) 0.9-1.7 s.
"""

from __future__ import annotations

import torch

from llmc.passes._base import DecompositionPass, register_pass

_aten = torch.ops.aten
REDUCES = ("sum", "prod", "mean", "amax", "amin")
# Scatters whose only rewrite is a non-negative dim (and a 0-d self as [1]).
_SCATTERS = (_aten.scatter_add.default, _aten.scatter.src, _aten.scatter.value)
# scatter(..., reduce="add" / "multiply"): eager's scatter_reduce "sum" / "prod" with self.
_REDUCE_ARG = {"add": "sum", "multiply": "prod"}
_NARROW_INTS = (torch.uint8, torch.int8, torch.int16)


def _identity(reduce: str, dtype: torch.dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _fill_hits(self: torch.Tensor, d: int, index: torch.Tensor, reduce: str) -> torch.Tensor:
    """self with every position the index hits set to the reduction's identity (eager's include_self=False)."""
    return _aten.scatter.value(self, d, index, _identity(reduce, self.dtype))


def scatter_mean(self: torch.Tensor, d: int, index: torch.Tensor, src: torch.Tensor, include_self: bool) -> torch.Tensor:
    """torch.scatter_reduce(self, d, index, src, "mean", include_self=...) with d >= 0, as eager computes it:
    the sum, over a count of the values summed (in self's dtype, as eager's), 1 where nothing hits."""
    total = _aten.scatter_reduce.two(self if include_self else _fill_hits(self, d, index, "sum"), d, index, src, "sum")
    count = _aten.scatter_add.default(torch.ones_like(self) if include_self else torch.zeros_like(self), d, index, torch.ones_like(src))
    count = torch.where(count == 0, torch.ones_like(count), count)
    if self.dtype.is_floating_point or self.dtype.is_complex:
        return total / count
    if self.dtype in _NARROW_INTS:  # torch-mlir cannot lower 8-bit floor division; int32 holds every quotient
        return torch.div(total.to(torch.int32), count.to(torch.int32), rounding_mode="floor").to(self.dtype)
    return torch.div(total, count, rounding_mode="floor")


def _as_1d(x):
    return x.reshape(1) if isinstance(x, torch.Tensor) and x.dim() == 0 else x


@register_pass("scatter-reduce")
class ScatterReducePass(DecompositionPass):
    def decompositions(self) -> dict:
        # Each entry re-calls the scatter ops, which come back to these entries: a call they leave
        # (non-negative dim, self of rank >= 1, ...) returns NotImplemented, and the op is kept.
        def scatter_reduce(self_, dim, index, src, reduce, include_self=True):
            if self_.dim() == 0:  # index and src are 0-d too (eager checks it)
                self.rewrote_here("0-d")
                return _aten.scatter_reduce.two(_as_1d(self_), 0, _as_1d(index), _as_1d(src), reduce, include_self=include_self).reshape(())
            d = dim % self_.dim()
            if self_.dtype == torch.bool and reduce in ("sum", "prod", "amax", "amin"):
                self.rewrote_here("bool")  # eager: sum and amax are "any", prod and amin "all"
                as_int = {"sum": "amax", "prod": "amin"}.get(reduce, reduce)
                i8 = _aten.scatter_reduce.two(self_.to(torch.int8), d, index, src.to(torch.int8), as_int, include_self=include_self)
                return i8.to(torch.bool)
            if self_.dtype == torch.uint8 and reduce in ("amax", "amin"):
                self.rewrote_here("uint8")  # torch-mlir compares uint8 as signed
                i16 = _aten.scatter_reduce.two(self_.to(torch.int16), d, index, src.to(torch.int16), reduce, include_self=include_self)
                return i16.to(torch.uint8)
            if reduce == "mean" and not include_self:
                self.rewrote_here("mean-without-self")
                return scatter_mean(self_, d, index, src, include_self)
            if reduce == "mean" and not (self_.dtype.is_floating_point or self_.dtype.is_complex):
                self.rewrote_here("int-mean")  # torch-mlir's mean rounds integers towards zero, eager floors
                return scatter_mean(self_, d, index, src, include_self)
            if include_self:
                if d == dim:
                    return NotImplemented  # IREE's scatter, as torch-mlir lowers it
                self.rewrote_here("negative-dim")
                return _aten.scatter_reduce.two(self_, d, index, src, reduce)
            self.rewrote_here(f"{reduce}-without-self")
            # The positions the index hits start from the identity; then the reduction with self.
            return _aten.scatter_reduce.two(_fill_hits(self_, d, index, reduce), d, index, src, reduce)

        def non_negative_dim(op):
            def scatter(self_, dim, index, src):  # src: a tensor (scatter_add, scatter.src) or a scalar
                if self_.dim() == 0:
                    self.rewrote_here("0-d")
                    return op(_as_1d(self_), 0, _as_1d(index), _as_1d(src)).reshape(())
                d = dim % self_.dim()
                if op is _aten.scatter_add.default and self_.dtype == torch.bool:
                    self.rewrote_here("bool")  # eager: "or"; IREE adds i1 (xor)
                    return _aten.scatter_reduce.two(self_.to(torch.int8), d, index, src.to(torch.int8), "amax").to(torch.bool)
                if d == dim:
                    return NotImplemented
                self.rewrote_here("negative-dim")
                return op(self_, d, index, src)

            return scatter

        def scatter_with_reduce_arg(self_, dim, index, src, *, reduce):
            self.rewrote_here(f"scatter-{reduce}")
            if not isinstance(src, torch.Tensor):  # scatter.value_reduce: the scalar in self's dtype, per index
                src = torch.full(index.shape, src, dtype=self_.dtype, device=self_.device)
            return _aten.scatter_reduce.two(self_, dim, index, src, _REDUCE_ARG[reduce])

        return {
            _aten.scatter_reduce.two: scatter_reduce,
            **{op: non_negative_dim(op) for op in _SCATTERS},
            _aten.scatter.reduce: scatter_with_reduce_arg,
            _aten.scatter.value_reduce: scatter_with_reduce_arg,
        }
