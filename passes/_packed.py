"""The cpu layout of narrow linear weights (fp8 codes, bf16 bits) and the graph that reads it.

Shared by `fp8-weights` and `bf16-weights` on llvm-cpu. A linear weight [N, K] stored narrower than
it is computed is kept as P[ceil(N/G), K, G] (P[b, k, j] = w[G*b + j, k]; N padded with zero rows to
a multiple of G), G output channels per group: 8 by default (fp8, int8; 32 where the C kernels serve,
KERNEL_GROUPS), or, for fp8 in a module whose every CPU has AVX512_BF16, the C kernel's pair layout of
64-channel groups (pack_pairs, below; every use but the kernels' reads a plain-layout copy). Its uses become:

- `x @ w.T` with one row of x (every linear of a decode step, prefill's LM head):
      (x.view(1, K/4, 4, 1) * dec(P).view(N/G, K/4, 4, G)).sum(1).sum(1).view(1, N)[:, :N] * s.T
  (+ bias for addmm; K % 4 != 0 keeps one partial sum per channel). IREE vectorizes that reduction
  along the G contiguous output channels of each K step, reading each weight once in its narrow
  form, with no transpose (the [N, K] form costs an 8x8 shuffle per 64 weights). That loop is bound
  by how far its loads run ahead of its arithmetic (instructions per byte read), not by the
  arithmetic: G = 16 shares each broadcast of x between two vectors (bf16 decode 5-8% faster than
  G = 8; docs/targets.md, "bf16 on cpu"). Splitting K into
  (K/4, 4) leaves 4 independent partial sums per channel: with one, every K step's multiply-add
  waited for the previous one (latency-bound: 1.3x llmc f32 on a 4096x4096 fp8 matvec; 3.2x with 4).
  Where compiler/ukernels.py's C kernels serve the target (ctx.options[KERNEL_OPTION]: llvm-cpu,
  AVX2 + FMA, a C compiler), the sum is instead `llmc::matvec_<kind>(x, P)` -> [1, N] (same decode,
  scale after it; docs/targets.md "cpu matvec kernels"): decode 1.08-1.22x bf16, 1.15-1.25x int8,
  1.1-1.25x 8B fp8.
- an embedding (a table tied to the output head): each row's codes are gathered from the packed
  layout (the row's group of G rows, then every G-th code) and only those are decoded.
- `x @ w.T` with M >= 2 f32 rows, fixed (a prefill chunk or bucket) or dynamic (the dynamic prefill's
  tokens), where the C kernels serve: `llmc::gemm_<kind>(x, P)` -> [M, N], a 6 x 16 register block
  over 16-channel panels (compiler/csrc; docs/targets.md "Prefill kernels"), scale and bias after it
  as above.
- every other use (multi-row products): the whole weight decoded and unpacked to [N, K] ahead of
  the first op. IREE packs that for its data-tiled matmul per call; a decode fused into a data-tiled
  matmul itself put a whole f32 K panel on the stack ("exceeded stack allocation limit").

`dec` is the caller's: integer ops from the stored bits to f32 (times a constant the scale
absorbs). Same values as the [N, K] weight: only the f32 summation order of the products differs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmc.passes._base import fill_fake_values

_aten = torch.ops.aten

PACK = 8  # default output channels per packed group: one AVX2 f32 vector (docs/targets.md, fp8 on cpu)
# Output channels per packed group where compiler/ukernels.py's C kernel computes the one-row products
# (the C code's layout). fp8: 32, one 256-bit load of codes per K step, decoded without a shuffle
# (21 vs 16.5 GB/s on one core with G = 8; docs/targets.md "cpu matvec kernels"). bf16: 32, a K step
# of a group is one 64-byte line (19.7 vs 15.9 GB/s with G = 16 on a 2048 x 768 product, Zen 4). int8:
# 32, one 32-byte row and one x broadcast per K step (0.86-0.87 vs 0.61-0.66 of a plain read over the
# Llama-3-8B-shaped products with G = 8, one Zen 4 core; docs/targets.md "cpu matvec kernels").
KERNEL_GROUPS = {"fp8": 32, "int8": 32, "bf16": 32, "f32": 16,  # f32: the many-row kernel only (passes/f32_gemm_weights.py)
                 "fp8dp": 64}  # fp8 in the pair layout (pack_pairs)
# The pair layout: where every CPU of the module has AVX512_BF16 (compiler/pipeline.py sets PAIRS_OPTION), an
# fp8 weight with an even K is stored for the C kernel's dot-product loop (`llmc_matvec_fp8dp`): 64-channel
# groups, each K pair (k, k + 1) of a group one 128-byte block of four 32-byte vectors, vector q's dword d the
# codes of (16q + d, k), (16q + 8 + d, k), (16q + d, k + 1), (16q + 8 + d, k + 1) (channel, k). Still
# [N/64, K, 64] in shape, so every other use reads it through `pairs_to_groups` (the plain layout). On one Zen 4
# core that loop reads the Llama-3-8B-shaped products 1.105x faster than the AVX2 loop over 32-channel groups
# (compiler/csrc/matvec_x86_64.c, docs/targets.md "fp8 with AVX-512 BF16 dot products").
PAIR_KINDS = {"fp8": "fp8dp"}  # kind -> its kind in the pair layout
PAIR_LAYOUTS = frozenset(PAIR_KINDS.values())  # the kinds stored in the pair layout (K even)
PAIRS_OPTION = "fp8_pairs"
KSPLIT = 4  # independent partial sums per output channel in a one-row product (docs/targets.md)
KERNEL_OPTION = "matvec_kernels"  # ctx.options: True when compiler/ukernels.py's kernels serve this target


KERNEL_OPS: dict[str, object] = {}  # kind -> torch.ops.llmc.matvec_<kind>.default, defined by the passes that pack


def define_kernel_op(kind: str, decode: Callable) -> None:
    """Define `llmc::matvec_<kind>(x[1, K] f32, P[N/G, K, G]) -> [1, N] f32`, the unscaled one-row product
    over packed codes. decode: the pass's own tensor decode (codes -> f32 as its graph decodes them).
    Eager: that decode and a sum in torch. Compiled: compiler/ukernels.py's C kernel."""

    @torch.library.custom_op(f"llmc::matvec_{kind}", mutates_args=())
    def op(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.einsum("k,bkg->bg", x.reshape(-1).float(), decode(p).float()).reshape(1, -1)

    @op.register_fake
    def _(x, p):
        return x.new_empty(1, p.shape[0] * p.shape[2], dtype=torch.float32)

    KERNEL_OPS[kind] = getattr(torch.ops.llmc, f"matvec_{kind}").default


GEMM_OPS: dict[str, object] = {}  # kind -> torch.ops.llmc.gemm_<kind>.default
# groups a many-row C loop must take together (none since int8's groups are 32 channels, two 16-wide
# panels each, as fp8's; with 8-channel groups it took them in pairs and an odd count kept IREE's matmul)
GEMM_GROUP_MULTIPLE: dict[str, int] = {}


def define_gemm_op(kind: str, decode: Callable) -> None:
    """Define `llmc::gemm_<kind>(x[M, K] f32, P[N/G, K, G]) -> [M, N] f32` (N = the padded channels), the
    unscaled many-row product over packed codes (M fixed: a prefill chunk or bucket; or dynamic: the dynamic prefill). Eager: the
    pass's decode and a matmul in torch. Compiled: compiler/ukernels.py's C kernel."""

    @torch.library.custom_op(f"llmc::gemm_{kind}", mutates_args=())
    def op(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.einsum("mk,bkg->mbg", x.float(), decode(p).float()).reshape(x.shape[0], -1)

    @op.register_fake
    def _(x, p):
        return x.new_empty(x.shape[0], p.shape[0] * p.shape[2], dtype=torch.float32)

    GEMM_OPS[kind] = getattr(torch.ops.llmc, f"gemm_{kind}").default


def kernel_kind(ctx, kind: str) -> str | None:
    """`kind` when its one-row products are C kernel calls for this pass context, else None."""
    return kind if ctx.options.get(KERNEL_OPTION) and kind in KERNEL_OPS else None


def group_for(ctx, kind: str, default: int = PACK) -> int:
    """Output channels per packed group for a `kind` weight under this pass context: the C kernel's
    layout where its kernel serves (kernel_kind), else `default` (the graph's own reduction)."""
    return KERNEL_GROUPS[kind] if kernel_kind(ctx, kind) else default


def layout_for(ctx, kind: str, k: int, default: int = PACK) -> tuple[int, str | None]:
    """(output channels per packed group, C kernel kind or None) of a `kind` weight with K = k under this pass
    context: the pair layout's kind (PAIR_KINDS, 64 channels) where ctx.options[PAIRS_OPTION] is set and K is
    even; else group_for's group with kernel_kind. A function of K and the options only, so every entry point
    of a program stores a weight alike. `pack_as` stores it so; a kernel kind in PAIR_LAYOUTS means pairs."""
    kernel = kernel_kind(ctx, kind)
    pair = PAIR_KINDS.get(kernel) if kernel else None
    if pair and ctx.options.get(PAIRS_OPTION) and k % 2 == 0:
        return KERNEL_GROUPS[pair], pair
    return group_for(ctx, kind, default), kernel


def pack_as(w: torch.Tensor, group: int, kernel: str | None) -> torch.Tensor:
    """`w` [N, K] stored as layout_for said: the pair layout for a PAIR_LAYOUTS kernel, else pack(w, group)."""
    return pack_pairs(w) if kernel in PAIR_LAYOUTS else pack(w, group)


def rows_form(rows: int, kernel_rows: int, gemm_rows: int = 0, dynamic_rows: int = 0) -> str:
    """The statistics suffix naming how a packed weight's one-row and many-row (fixed or dynamic row count)
    products were written."""
    parts = ([f"{kernel_rows} one-row product(s) as C kernel calls"] if kernel_rows else []) + (
        [f"{rows - kernel_rows} one-row product(s) as a reduction"] if rows > kernel_rows else []) + (
        [f"{gemm_rows} fixed many-row product(s) as C kernel calls"] if gemm_rows else []) + (
        [f"{dynamic_rows} dynamic many-row product(s) as C kernel calls"] if dynamic_rows else [])
    return "".join(", " + part for part in parts)


def padded(n: int, group: int = PACK) -> int:
    return -(-n // group) * group


def pack(w: torch.Tensor, group: int = PACK) -> torch.Tensor:
    """[N, K] -> [ceil(N/group), K, group], N padded with zeros."""
    n, k = w.shape
    if n % group:
        w = torch.cat([w, w.new_zeros(padded(n, group) - n, k)])
    return w.reshape(-1, group, k).permute(0, 2, 1).contiguous()


def pack_pairs(w: torch.Tensor) -> torch.Tensor:
    """[N, K] (K even) -> the pair layout (above), shaped [ceil(N/64), K, 64], N padded with zeros."""
    n, k = w.shape
    if k % 2:
        raise ValueError(f"the pair layout needs an even K, got {k}")
    if n % 64:
        w = torch.cat([w, w.new_zeros(padded(n, 64) - n, k)])
    # channel 64b + 16q + 8h + d, k = 2kp + kk  ->  [b, kp, q, d, kk, h]
    return w.reshape(-1, 4, 2, 8, k // 2, 2).permute(0, 4, 1, 3, 5, 2).reshape(-1, k, 64).contiguous()


_PAIR_BLOCK = (4, 8, 2, 2)  # a K pair's 128 bytes: [q, d, kk, h]
_PAIRS_TO_PLAIN = [0, 1, 4, 2, 5, 3]  # [b, kp, q, d, kk, h] -> [b, kp, kk, q, h, d]: k = 2kp + kk, j = 16q + 8h + d


def pairs_to_groups(p: torch.Tensor) -> torch.Tensor:
    """The pair layout -> the plain one, P[b, k, j] = w[64b + j, k] (what `pack(w, 64)` gives)."""
    b, k, _ = p.shape
    return p.reshape(b, k // 2, *_PAIR_BLOCK).permute(*_PAIRS_TO_PLAIN).reshape(b, k, 64)


def emit_pairs_to_groups(graph, node, groups: int, k: int):
    """pairs_to_groups as graph nodes (a copy of the codes: the uses other than the C kernels')."""
    call = graph.call_function
    v = call(_aten.view.default, (node, [groups, k // 2, *_PAIR_BLOCK]))
    t = call(_aten.permute.default, (v, _PAIRS_TO_PLAIN))
    c = call(_aten.clone.default, (t,), {"memory_format": torch.contiguous_format})
    return call(_aten.view.default, (c, [groups, k, 64]))


def unpack(p: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of `pack` for an [n, K] weight (any group)."""
    return p.permute(0, 2, 1).reshape(-1, p.shape[1])[:n]


def rewrite_uses(graph, node, shape: tuple[int, int], dec: Callable, outputs, *, scale=None, per_row: bool = True,
                 rows_dec: Callable | None = None, group: int = PACK, kernel: str | None = None) -> int:
    """Rewrite every use of the packed weight `node` (originally [N, K] = `shape`) as described above.

    dec(graph, codes_node) -> f32 node: the decode of stored codes, emitted at the insertion point.
    scale: a node (already including any constant the decode leaves out), [N, 1] if per_row else
        [1, 1], multiplied into the result; None for none.
    rows_dec(graph, codes_node, ids_node) -> node: an embedding's value from its gathered codes
        ([*ids, K]) and its ids; default dec(codes) (times the rows' scales).
    outputs: the program's output specs (an output found by node name is renamed with its node).
    group: output channels per packed group, as `pack(w, group)` stored it.
    kernel: a KERNEL_OPS kind (kernel_kind): one-row products with an f32 x become
        `llmc::matvec_<kernel>(x, P)` (the same unscaled sum, run by compiler/ukernels.py's C kernel),
        and, where GEMM_OPS has the kind, products with M >= 2 f32 rows, fixed (a prefill chunk's or
        bucket's) or dynamic (the dynamic prefill's), `llmc::gemm_<kernel>(x, P)`.
        A kernel kind in PAIR_LAYOUTS: `node` is in the pair layout (pack_pairs, group 64); the kernels read it
        as it is, every other use through one copy in the plain layout (emit_pairs_to_groups), made ahead of
        the first op.
    Returns (one-row products, how many of them are kernel calls, fixed and dynamic many-row kernel calls).
    """
    call = graph.call_function
    n, k = shape
    npad = padded(n, group)
    rows = kernel_rows = gemm_rows = dynamic_rows = 0
    decoders = set()  # the decode chains' own reads of the codes
    plain = []  # the pair layout's plain-layout copy, once made

    def plain_codes():
        """The codes in the plain layout, as the graph's own decodes and gathers read them."""
        if kernel not in PAIR_LAYOUTS:
            return node
        if not plain:
            before = set(node.users)
            with graph.inserting_before(next(n_ for n_ in graph.nodes if n_.op != "placeholder")):
                plain.append(emit_pairs_to_groups(graph, node, npad // group, k))
            decoders.update(set(node.users) - before)
        return plain[0]

    def decode():
        src = plain_codes()
        before = set(src.users)
        f = dec(graph, src)
        decoders.update(set(src.users) - before)
        return f

    uses, chain = _transposed_uses(node)
    for wt, product in uses:
        x, m = _rows_input(product, wt, k)
        many = m >= 2 or m == DYNAMIC_ROWS
        if m == 0:
            continue
        if many:  # two or more rows: the many-row kernel, where there is one for this kind and group count
            if (kernel not in GEMM_OPS or (npad // group) % GEMM_GROUP_MULTIPLE.get(kernel, 1)
                    or x.meta["val"].dtype != torch.float32):
                continue
        with graph.inserting_before(product):
            fake_x = x.meta.get("val")
            if many:
                y = call(GEMM_OPS[kernel], (x, node))
                decoders.add(y)
                if m == DYNAMIC_ROWS:
                    dynamic_rows += 1
                else:
                    gemm_rows += 1
            elif kernel is not None and fake_x is not None and fake_x.dtype == torch.float32:
                y = call(KERNEL_OPS[kernel], (x, node))
                decoders.add(y)
                kernel_rows += 1
            else:
                lanes = KSPLIT if k % KSPLIT == 0 else 1
                w = call(_aten.view.default, (decode(), [npad // group, k // lanes, lanes, group]))
                prod = call(_aten.mul.Tensor, (call(_aten.view.default, (x, [1, k // lanes, lanes, 1])), w))
                y = call(_aten.sum.dim_IntList, (call(_aten.sum.dim_IntList, (prod, [1])), [1]))
                y = call(_aten.view.default, (y, [1, npad]))
            if npad != n:
                y = call(_aten.slice.Tensor, (y, 1, 0, n))
            if scale is not None:
                y = call(_aten.mul.Tensor, (y, call(_aten.view.default, (scale, [1, -1]))))
            if product.target == _aten.addmm.default:
                y = call(_aten.add.Tensor, (product.args[0], y))
        replace(graph, product, y, outputs)
        rows += not many
    for dead in reversed(chain):  # the casts and transposes the rewritten products no longer read
        if not dead.users:
            graph.erase_node(dead)
    for user in [u for u in node.users if u.target == _aten.embedding.default and u.args[0] is node]:
        with graph.inserting_before(user):
            # Row r's codes are P[r // G, :, r % G]: gather the whole group of G rows as one table
            # row of K * G codes, then every G-th one from r % G. (A two-index aten.index.Tensor on
            # [N/8, 8, K] fails in torch-mlir: "failed to legalize operation
            # 'torch.aten.index.Tensor_hacked_twin'".)
            ids = user.args[1]
            groups = call(_aten.view.default, (plain_codes(), [npad // group, k * group]))
            decoders.add(groups)
            row_group = call(_aten.div.Scalar_mode, (ids, group), {"rounding_mode": "floor"})
            lane = call(_aten.remainder.Scalar, (ids, group))
            rows8 = call(_aten.embedding.default, (groups, row_group))  # [*ids, K * group]
            steps = call(_aten.arange.start_step, (0, k * group, group), {"dtype": torch.int64})
            where = call(_aten.add.Tensor, (call(_aten.unsqueeze.default, (lane, -1)), steps))  # [*ids, K]
            codes = call(_aten.gather.default, (rows8, -1, where))
            value = rows_dec(graph, codes, ids) if rows_dec is not None else dec(graph, codes)
        drop_metadata_asserts(graph, user)
        replace(graph, user, value, outputs)
    rest = [u for u in node.users if u not in decoders]
    if rest:
        # Ahead of the first op, after the scale if that is computed (the order of graph.nodes is
        # the program's).
        first = next(n_ for n_ in graph.nodes if n_.op != "placeholder")
        with graph.inserting_before(scale.next if scale is not None and scale.op != "placeholder" else first):
            full = decode()
            if scale is not None:
                s = scale
                if per_row and npad != n:
                    s = call(_aten.constant_pad_nd.default, (s, [0, 0, 0, npad - n]))
                full = call(_aten.mul.Tensor, (full, call(_aten.view.default, (s, [npad // group, 1, group] if per_row else [1, 1, 1]))))
            full = call(_aten.permute.default, (full, [0, 2, 1]))
            full = call(_aten.view.default, (call(_aten.clone.default, (full,), {"memory_format": torch.contiguous_format}), [npad, k]))
            if npad != n:
                full = call(_aten.slice.Tensor, (full, 0, 0, n))
        for user in rest:
            user.replace_input_with(node, full)
            # A narrow weight's transpose now reads f32: its fake value is recomputed by the caller
            # (it propagates every node without one) and torch-mlir must not see the old dtype.
            if not _is_cast(user):
                user.meta.pop("val", None)
                user.meta.pop("tensor_meta", None)
    return rows, kernel_rows, gemm_rows, dynamic_rows


def replace(graph, old, new, outputs) -> None:
    """Every use of `old` reads `new`, the program's outputs included (found by node name), and
    `old` is erased."""
    old.replace_all_uses_with(new)
    for spec in outputs:
        if getattr(spec.arg, "name", None) == old.name:
            spec.arg.name = new.name
    graph.erase_node(old)


def drop_metadata_asserts(graph, node) -> None:
    """Erase the `aten._assert_tensor_metadata` checks on `node` (torch.export writes one before a
    `.to(dtype)` of it, asserting the dtype the node had): its replacement has the compute dtype."""
    for user in list(node.users):
        if user.op == "call_function" and user.target == _aten._assert_tensor_metadata.default:
            graph.erase_node(user)


def _is_cast(node) -> bool:
    """A dtype conversion to f32 (dtype-harmony's cast of a narrow weight): the decode is f32 already."""
    if node.op != "call_function":
        return False
    if node.target == torch.ops.prims.convert_element_type.default:
        return node.args[1] == torch.float32
    return node.target == _aten._to_copy.default and set(node.kwargs) == {"dtype"} and node.kwargs["dtype"] == torch.float32


def _transposed_uses(node) -> tuple[list, list]:
    """((w.T as the product sees it, the product) for each product reached from the weight through
    one transpose, with an f32 cast before or after it (a narrow weight in an f32 program); the
    casts and transposes on the way, weight side first)."""
    uses, chain = [], []
    starts = [node] + [u for u in node.users if _is_cast(u)]
    chain.extend(starts[1:])
    for start in starts:
        for t in [u for u in start.users if _is_transpose(u)]:
            chain.append(t)
            for user in list(t.users):
                if _is_cast(user):
                    chain.append(user)
                    uses.extend((user, p) for p in list(user.users))
                else:
                    uses.append((t, user))
    return uses, chain


def _is_transpose(node) -> bool:
    return node.op == "call_function" and (
        node.target == _aten.t.default or (node.target == _aten.permute.default and list(node.args[1]) == [1, 0]))


DYNAMIC_ROWS = -1  # _rows_input's M for x [S, K] with a symbolic S (a dynamic prefill's tokens)


def _rows_input(product, weight_t, k) -> tuple[object, int]:
    """(x, M) of `mm(x, weight_t)` / `addmm(b, x, weight_t)` (default alpha and beta) when x is [M, K]: M
    static, or DYNAMIC_ROWS for a symbolic row count (never compared: that would add a guard to the
    program); (None, 0) otherwise."""
    if product.target == _aten.mm.default and product.args[1] is weight_t:
        x = product.args[0]
    elif product.target == _aten.addmm.default and product.args[2] is weight_t and not product.kwargs:
        x = product.args[1]
    else:
        return None, 0
    val = x.meta.get("val") if hasattr(x, "meta") else None
    if val is None or val.dim() != 2 or isinstance(val.shape[1], torch.SymInt) or val.shape[1] != k:
        return None, 0
    return x, DYNAMIC_ROWS if isinstance(val.shape[0], torch.SymInt) else int(val.shape[0])


def _static_rows_input(product, weight_t, k) -> tuple[object, int]:
    """_rows_input for a static M only: (None, 0) for a symbolic row count."""
    x, m = _rows_input(product, weight_t, k)
    return (x, m) if m != DYNAMIC_ROWS else (None, 0)


# Ops a weight reaches a matrix product through, and the products themselves.
VIEWS = {
    _aten.t.default, _aten.permute.default, _aten.transpose.int, _aten.view.default, _aten.reshape.default,
    _aten._unsafe_view.default, _aten.expand.default, _aten.unsqueeze.default, _aten.clone.default,
    _aten._to_copy.default, _aten.alias.default, torch.ops.prims.convert_element_type.default,
}
PRODUCTS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.matmul.default, _aten.linear.default}
EMBEDDING = {_aten.embedding.default}


def feeds(node, targets, seen=None) -> bool:
    """Whether `node` reaches an op in `targets` through view-like ops only."""
    seen = seen if seen is not None else set()
    for user in node.users:
        if user in seen:
            continue
        seen.add(user)
        if user.target in targets:
            return True
        if user.target in VIEWS and feeds(user, targets, seen):
            return True
    return False


def propagate_fake(graph, node, scale_node, fake, stored, scale) -> None:
    """Fake-tensor metadata for the stored weight (`stored`), its scale placeholder (None for none)
    and every new node without one (torch-mlir's importer reads node.meta['val'])."""
    mode = getattr(fake, "fake_mode", None)
    node.meta["val"] = mode.from_tensor(stored, static_shapes=True) if mode is not None else stored
    if scale_node is not None:
        scale_node.meta["val"] = mode.from_tensor(scale, static_shapes=True) if mode is not None else scale
    fill_fake_values(graph, mode)
