"""Hand-written cpu kernels for the one-row products over packed narrow weights (decode steps), and
for the many-row products over them (prefill chunks and buckets with a fixed M, the dynamic prefill with
M read from x: `llmc::gemm_<kind>`, the same two steps below with x [M, K], one workgroup per run of
groups, every row; kind f32 too, fixed M only: f32 weights stored in the same 16-channel panels by
passes/f32_gemm_weights.py, `f32_gemm_unavailable` says where).

What: on llvm-cpu for x86-64 CPUs with AVX2 + FMA, every one-row product over a packed fp8, int8 or
bf16 weight (passes/_packed.py: `x[1, K] @ w.T` with w stored as P[N/G, K, G]) runs as
`compiler/csrc/matvec_x86_64.c` instead of the loop IREE generates for it. The graph passes emit
`llmc::matvec_<kind>(x, P)` (its eager meaning is the same sum in torch, `passes/_packed.py`);
this module turns each into an IREE dispatch of that C function:

  1. `lower_calls(module)` (at import, before torch-mlir's backend pipeline, which refuses any
     `torch.operator`): each op becomes `torch_c.to_builtin_tensor` + a call of a private function
     `@__llmc_matvec_<kind>_<G>x<K>` (declared only) + `torch_c.from_builtin_tensor`.
  2. `link(mlir_text, arch)` (on the text iree-compile gets): each such declaration gets its body, a
     `flow.dispatch` of the export `@__llmc_kernels::@matvec_<kind>`, and the module gets that
     `stream.executable`: one export per kind whose function calls the C function
     (`hal.import.static`), the object file named in `hal.executable.objects` (by its path in the
     cache). IREE links it into every llvm-cpu executable variant it builds.

Why: IREE 3.13's vectorized loop reads one group of channels at a time with no software prefetch,
and is bound by how far its loads run ahead of its arithmetic; the C loop reads a workgroup's groups
one after the other as one sequential stream (bf16 groups of 64 KiB or more 2 side by side, bf16's
every group on Zen 3: BF16_PAIR_MIN_K_BY_CPU; int8's and fp8's with a prefetch ahead), fp8 (32 channels a group) decodes
32 codes from one load without a shuffle, and a K step of a bf16 group (32 channels) is one cache
line; in a module whose every CPU has AVX512_BF16, fp8 weights are packed in a pair layout (kind fp8dp,
64 channels) that a dot-product loop reads with x as two bf16 halves (fp8_x_halves), each term within
2^-17 of itself. Measured in docs/targets.md ("cpu matvec kernels").

Safe because: the C decode of each weight is the graph's own (bit-exact: integer ops and the f32 read
of the result, or int -> f32), the scale and its factor stay in the graph after the sum, and only
the f32 summation order differs, as it already does between IREE's own tilings (fp8dp: and x, taken as
two bf16 halves, is within 2^-17 of itself in every product; tests/compiler/test_ukernels.py bounds it). Used only where
every CPU the module is built for has AVX2 and FMA (`unavailable`); the object is built with the
system C compiler (`$CC`, else cc, gcc or clang) once per source and compiler, and cached. Without a
C compiler, or with LLMC_CPU_KERNELS=off, the graph keeps IREE's own loop (same values).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from llmc.errors import CompileError
from llmc.passes._packed import GEMM_GROUP_MULTIPLE, KERNEL_GROUPS, PAIR_LAYOUTS

SOURCE = Path(__file__).parent / "csrc" / "matvec_x86_64.c"
# The ops the graph passes emit, as torch-mlir imports them (`torch.operator "torch.llmc.matvec_fp8"`).
OPERATOR_PREFIX = "torch.llmc.matvec_"
ATTN_OPERATOR = "torch.llmc.attn_decode"  # a decode step's attention (passes/decode_attention_kernel.py)
ATTN_DECL_PREFIX = "__llmc_attn_decode_"
CHUNK_OPERATOR = "torch.llmc.attn_chunk"  # a prefill chunk's attention (passes/chunk_attention_kernel.py)
CHUNK_DECL_PREFIX = "__llmc_attn_chunk_"
GEMM_PREFIX = "torch.llmc.gemm_"  # many-row products (llmc::gemm_<kind>: prefill chunks and buckets, M fixed; the dynamic prefill, M from x)
# kind -> (element type of the packed codes, output channels per group G: the passes pack that way)
KINDS = {kind: (elem, KERNEL_GROUPS[kind]) for kind, elem in (("fp8", "i8"), ("int8", "i8"), ("bf16", "i16"), ("fp8dp", "i8"))}
# The many-row kernels: the narrow kinds, and f32 weights stored packed (passes/f32_gemm_weights.py)
GEMM_LAYOUTS = {**KINDS, "f32": ("f32", KERNEL_GROUPS["f32"])}
GEMM_KINDS = tuple(GEMM_LAYOUTS)
# Weight bytes one workgroup reads: large enough that IREE's per-workgroup cost is small against its
# streaming, small enough that a layer has several per thread. Measured on small-125m fp8 decode at 2
# threads: 24, 128, 512 KiB -> 6.2, 5.5-5.7, 6.0 ms a step; the same at 1 thread (docs/targets.md).
BYTES_PER_WORKGROUP = 128 * 1024
MIN_WORKGROUPS = 16
# bf16 one-row products: groups of K >= this are read two side by side, smaller ones one after the other
# (the C function's `pair_min_k`). Which is faster depends on the core: on Zen 4 one stream (small-125m
# bf16 decode 108.2 -> 124.4 tok/s; at K = 2048 a C harness read two streams 5-8% faster, hence 1024);
# on Zen 3 two streams at every K (44.0 -> 48.9 tok/s at 1 thread, 71.7 -> 76.8 at 2). A CPU not listed
# (generic x86-64-v3/v4 included) gets the default; a module for several CPUs gets it unless all agree.
BF16_PAIR_MIN_K = 1024
BF16_PAIR_MIN_K_BY_CPU = {"znver3": 0}
# How far ahead of its stream the fp8 and int8 one-row loop prefetches (the C function's `ahead`), in bytes.
# Zen 4 at ~34 GB/s: 512 best (a harness over 8B-shaped layers, 1024 / 2048 read 0.88x / 0.92x of it). A Zen 3
# VM at 12-14 GB/s: 2048 (the loops 0.86-0.92 of a plain read against 0.72-0.80; small-125m fp8 decode in
# IREE, 2048 against 512: fp8 1.232x / 1.179x at 1 / 2 threads, int8 1.144x / 1.103x). Chosen like
# BF16_PAIR_MIN_K_BY_CPU.
MATVEC_PREFETCH = 512
MATVEC_PREFETCH_BY_CPU = {"znver3": 2048}
# bf16 one-row products in a module whose every CPU has AVX-512F call the C loop's 512-bit form (each
# 64-byte K step decoded whole by a shift and an and, instead of four widening loads and four shifts;
# bit-identical sums): small-125m bf16 decode 1.091x / 1.074x at 1 thread on Zen 4, no clear change at 2
# (docs/targets.md). Unmeasured on Intel AVX-512 cores.
BF16_MATVEC_FUNCTION = "llmc_matvec_bf16"
BF16_MATVEC_FUNCTION_AVX512 = "llmc_matvec_bf16_avx512"
# fp8 weights in a module whose every CPU has these are packed for the dot-product loop (kind fp8dp,
# passes/_packed.py pack_pairs, `llmc_matvec_fp8dp`): x split into two bf16 halves the graph computes
# (fp8_x_halves), vdpbf16ps over bf16 pairs decoded from the codes with shifts and ands; 1.105x the AVX2 loop's
# rate over the Llama-3-8B-shaped products on one Zen 4 core (docs/targets.md). Zen 4 and 5, Cooper Lake,
# Sapphire Rapids and later Xeons have them; x86-64-v4 and Ice Lake do not.
FP8_PAIR_FEATURES = ("avx512f", "avx512vl", "avx512bf16")
FP8_X_SCALE = 2.0**32  # the dot-product loop's x is taken x 2^32 (its C comment says why) and its sums x 2^-32
EXECUTABLE = "__llmc_kernels"
DECL_PREFIX = "__llmc_matvec_"
GEMM_DECL_PREFIX = "__llmc_gemm_"
GEMM_FEW_WORKGROUPS = 15  # a many-row product's column blocks: at most this many workgroups, or ...
GEMM_MANY_WORKGROUPS = 64  # ... at least this many (gemm_groups_per_workgroup says why)
NO_COMPILER = "no C compiler"  # starts the reasons worth a warning: the target could have the kernels
ENV = "LLMC_CPU_KERNELS"  # "off": keep IREE's generated loop (A/B runs, a suspected kernel bug); "all": the f32 GEMM with AVX-512 too
_FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
          "-fno-asynchronous-unwind-tables", "-fno-exceptions", "-c")


def c_compiler() -> str | None:
    """The C compiler to build the kernels with: $CC, else cc, gcc or clang on PATH (None: none)."""
    for name in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable(target) -> str | None:
    """Why `target` (a compiler.targets.ResolvedTarget) gets no kernels, or None when it does."""
    from llmc.compiler import targets

    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return f"{ENV}={os.environ[ENV]}"
    if target is None or getattr(target.caps, "backend", None) != "llvm-cpu":
        return "not an llvm-cpu target"
    if getattr(target, "devices", 1) > 1:
        return "several devices"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the C compiler here builds for {platform.machine()}, not x86-64"
    for cpu in targets.cpu_variants(target.arch):
        _, features = targets.llvm_cpu_features(cpu)
        missing = [f for f in ("avx2", "fma") if f not in features]
        if missing:
            return f"--arch {cpu} lacks {' and '.join(missing)}"
    if c_compiler() is None:
        return NO_COMPILER + " found (set CC, or install gcc or clang)"
    try:
        build_object()  # decided here, before any pass emits a kernel op: a compiler that fails is no compiler
    except CompileError as e:
        return f"{NO_COMPILER} that works: {e}"
    return None


def f32_gemm_unavailable(target) -> str | None:
    """Why `target` gets no f32 many-row kernel (passes/f32_gemm_weights.py), or None when it does: the
    kernels' own conditions, and a CPU without AVX-512 among the module's. IREE's AVX-512 matmul (16 x 16
    tiles) ran as fast as the AVX2 6 x 16 block on Zen 4 (small-125m f32 prefill 211.6 vs 213.3 ms) and has
    twice its vector width where a core has two 512-bit FMA units; with AVX2 it uses 8 x 8 tiles, which
    the block beats by 1.21x (docs/targets.md "Prefill kernels")."""
    from llmc.compiler import targets

    why_not = unavailable(target)
    if why_not is None and os.environ.get(ENV, "").strip().lower() != "all" and all(
            "avx512f" in targets.llvm_cpu_features(cpu)[1] for cpu in targets.cpu_variants(target.arch)):
        return f"--arch {target.arch}: every CPU has AVX-512, where IREE's own f32 matmul is as fast"
    return why_not


def _cache_dirs() -> list[Path]:
    """Where the object may go, in order: $LLMC_CACHE_DIR/kernels or ~/.cache/llmc/kernels, then a
    per-user folder in the temp directory (a read-only home)."""
    root = os.environ.get("LLMC_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmc")
    return [Path(root) / "kernels", Path(tempfile.gettempdir()) / f"llmc-kernels-{os.getuid()}"]


def build_object() -> Path:
    """The kernels' object file, built on first use and cached by source, compiler and flags."""
    cc = c_compiler()
    if cc is None:
        raise CompileError("the cpu matvec kernels need a C compiler: install gcc or clang, set CC, or set LLMC_CPU_KERNELS=off")
    key = hashlib.sha256("\0".join([SOURCE.read_text(), _version(cc), *_FLAGS]).encode()).hexdigest()[:16]
    name = f"matvec_x86_64-{key}.o"
    for folder in _cache_dirs():
        if (folder / name).exists() and _private(folder):
            return folder / name
    for folder in _cache_dirs():
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _private(folder):
                return _build(cc, folder / name)
        except PermissionError:
            continue
    raise CompileError(f"no writable folder for the cpu kernels' object (tried {', '.join(map(str, _cache_dirs()))}): set LLMC_CACHE_DIR")


@functools.lru_cache(maxsize=None)
def _version(cc: str) -> str:
    """`cc --version` (part of the object's cache key), asked once per process: every plan asks."""
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise CompileError(f"the C compiler {cc} does not run: {e}") from e


def _private(folder: Path) -> bool:
    """Ours and writable by no one else: code linked into every module is never taken from a folder
    another user could have put an object in (the temp fallback is shared)."""
    st = folder.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _build(cc: str, out: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".o.tmp", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["no message"])[0]
            raise CompileError(f"{cc} failed to build {SOURCE.name}: {first} (set LLMC_CPU_KERNELS=off to do without the kernels)",
                               diagnostics=proc.stderr)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# ---------------------------------------------------------------------------------------------
# 1. at import: torch.operator -> call of a declared function


def declaration_name(kind: str, groups: int, k: int) -> str:
    return f"{DECL_PREFIX}{kind}_{groups}x{k}"


def gemm_declaration_name(kind: str, m: int | None, groups: int, k: int) -> str:
    """m None: a dynamic row count (written D)."""
    return f"{GEMM_DECL_PREFIX}{kind}_{'D' if m is None else m}x{groups}x{k}"


def lower_calls(module) -> int:
    """Replace every `llmc::matvec_<kind>` and `llmc::gemm_<kind>` op in `module` (torch-mlir, before the
    backend pipeline) with a call of a declared builtin-tensor function; returns how many."""
    from torch_mlir import ir

    from llmc.passes._base import vtensor_dims, walk_ops

    ops = [op for op in walk_ops(module, {"torch.operator"})
           if ir.StringAttr(op.attributes["name"]).value.startswith((OPERATOR_PREFIX, GEMM_PREFIX, ATTN_OPERATOR, CHUNK_OPERATOR))]
    if not ops:
        return 0
    declared = set()
    with module.context, ir.Location.unknown():
        for op in ops:
            op_name = ir.StringAttr(op.attributes["name"]).value
            if op_name.startswith(ATTN_OPERATOR):
                _lower_attention(module, op, declared)
                continue
            if op_name.startswith(CHUNK_OPERATOR):
                _lower_chunk_attention(module, op, declared)
                continue
            gemm = op_name.startswith(GEMM_PREFIX)
            kind = op_name[len(GEMM_PREFIX if gemm else OPERATOR_PREFIX):].split(".")[0]
            elem, group = (GEMM_LAYOUTS if gemm else KINDS)[kind]
            torch_elem = elem if elem.startswith("f") else "s" + elem  # the vtensor's element type
            x, p = op.operands
            xs, ps = vtensor_dims(str(x.type)), vtensor_dims(str(p.type))
            groups, k = (int(d) if d.isdigit() else -1 for d in ps[0][:2])
            odd_pairs = kind in PAIR_LAYOUTS and k % 2  # the pair layout holds K pairs
            even = ", K even (the pair layout)" if kind in PAIR_LAYOUTS else ""
            if gemm:
                # x [M, K] f32 with M fixed or dynamic ("?"), codes [G, K, group] (static)
                rows = xs[0][0] if len(xs[0]) == 2 else ""
                m = None if rows == "?" else int(rows) if rows.isdigit() else -1
                if (kind not in GEMM_KINDS or groups < 1 or (m is not None and m < 1) or groups % GEMM_GROUP_MULTIPLE.get(kind, 1)
                        or (xs, ps[0][2], ps[1]) != (([rows, str(k)], "f32"), str(group), torch_elem) or odd_pairs):
                    raise CompileError(f"llmc::gemm_{kind} takes x [M, K] f32 and {torch_elem} codes [N/{group}, K, {group}], "
                                       f"K and the codes static{even}; got {x.type} and {p.type}")
                name = gemm_declaration_name(kind, m, groups, k)
            else:
                m = 1
                # the kernel's only form: x [1, K] f32, codes [G, K, group] (static)
                if groups < 1 or (xs, ps[0][2], ps[1]) != ((["1", str(k)], "f32"), str(group), torch_elem) or odd_pairs:
                    raise CompileError(f"llmc::matvec_{kind} takes x [1, K] f32 and {torch_elem} codes [N/{group}, K, {group}], static{even}; "
                                       f"got {x.type} and {p.type}")
                name = declaration_name(kind, groups, k)
            dim = "?" if m is None else m
            types = [ir.Type.parse(t) for t in (f"tensor<{dim}x{k}xf32>", f"tensor<{groups}x{k}x{group}x{elem}>",
                                                 f"tensor<{dim}x{groups * group}xf32>")]
            _replace_with_call(module, op, name, types[:2], types[2], declared)
    return len(ops)


def _replace_with_call(module, op, name: str, arg_types: list, result_type, declared: set) -> None:
    """Replace the torch.operator `op` by a call of the private function `name` (declared in `module`
    once: `declared` holds the names so far) on its operands as builtin tensors of `arg_types`."""
    from torch_mlir import ir

    if name not in declared:
        fn_type = ir.FunctionType.get(arg_types, [result_type])
        decl = ir.Operation.create("func.func", attributes={
            "sym_name": ir.StringAttr.get(name), "function_type": ir.TypeAttr.get(fn_type),
            "sym_visibility": ir.StringAttr.get("private")}, regions=1)
        module.body.append(decl)
        declared.add(name)
    with ir.InsertionPoint(op), op.location:
        args = [ir.Operation.create("torch_c.to_builtin_tensor", results=[t], operands=[x]).result for t, x in zip(arg_types, op.operands)]
        call = ir.Operation.create("func.call", results=[result_type], operands=args,
                                   attributes={"callee": ir.FlatSymbolRefAttr.get(name)}).result
        y = ir.Operation.create("torch_c.from_builtin_tensor", results=[op.results[0].type], operands=[call]).result
    op.results[0].replace_all_uses_with(y)
    op.erase()


# The KV cache element types the attention kernel reads: the torch-mlir/MLIR element -> how the C function
# sees it (bf16 as its bits: llmc_attn_decode_bf16 widens each element exactly)
ATTN_CACHE_ELEMENTS = {"f32": "f32", "bf16": KINDS["bf16"][0]}


def _attention_export(cache: str) -> str:
    """The executable export (and C function, llmc_ + it) of the attention kernel over this cache element."""
    return "attn_decode" + ("" if cache == "f32" else "_" + cache)


def attention_declaration_name(hq: int, hk: int, c: int, d: int, length: int | None = None, cache: str = "f32") -> str:
    """The declared attention function for these shapes; length: a static L (None: L from the bias's dim);
    cache: the KV cache's element type (f32 or bf16)."""
    return f"{ATTN_DECL_PREFIX}{'' if cache == 'f32' else cache + '_'}{hq}x{hk}x{c}x{d}" + ("" if length is None else f"_L{length}")


def _lower_attention(module, op, declared: set) -> None:
    """`llmc::attn_decode(q [1, Hq, 1, D], kc [1, Hk, C, D], vc, bias [1, 1, 1, L])` -> a call of a declared
    function on builtin tensors (L dynamic or static)."""
    from torch_mlir import ir

    from llmc.passes._base import vtensor_dims
    from llmc.passes.decode_attention_kernel import MAX_GROUP, MAX_HEAD_DIM

    q, kc, vc, bias = op.operands
    (qs, qe), (ks, ke), (vs, ve), (bs, be) = (vtensor_dims(str(t.type)) for t in (q, kc, vc, bias))
    ok = (len(qs) == 4 and len(ks) == 4 and len(bs) == 4 and (qe, be) == ("f32",) * 2 and ke == ve
          and ke in ATTN_CACHE_ELEMENTS and ks == vs
          and all(x.isdigit() for x in (*qs, *ks)) and qs[0] == qs[2] == ks[0] == "1" and qs[3] == ks[3]
          and bs[:3] == ["1", "1", "1"])
    hq, hk, c, d = (int(x) for x in (qs[1], ks[1], ks[2], qs[3])) if ok else (0, 1, 0, 0)
    # the C kernel's stack arrays hold MAX_GROUP query heads of MAX_HEAD_DIM floats
    if not ok or hk < 1 or hq % hk or hq // hk > MAX_GROUP or d % 8 or not 0 < d <= MAX_HEAD_DIM:
        raise CompileError(f"llmc::attn_decode takes q [1, Hq, 1, D], caches [1, Hk, C, D] (f32 or bf16, both alike) and a "
                           f"bias [1, 1, 1, L], q and the bias f32, all static but L, with at most {MAX_GROUP} query heads "
                           f"per KV head and D a multiple of 8 up to {MAX_HEAD_DIM}; got {q.type}, {kc.type}, {vc.type}, {bias.type}")
    length = int(bs[3]) if bs[3].isdigit() else None
    name = attention_declaration_name(hq, hk, c, d, length, ke)
    t_q, t_c = ir.Type.parse(f"tensor<1x{hq}x1x{d}xf32>"), ir.Type.parse(f"tensor<1x{hk}x{c}x{d}x{ke}>")
    t_b = ir.Type.parse(f"tensor<1x1x1x{'?' if length is None else length}xf32>")
    _replace_with_call(module, op, name, [t_q, t_c, t_c, t_b], t_q, declared)


def chunk_attention_declaration_name(hq: int, hk: int, c: int, cm: int, d: int, length: int | None = None,
                                     cache: str = "f32") -> str:
    """The declared prefill-chunk attention function: Hq query heads of C rows on Hk KV heads of a cache of
    Cm rows, head size D; length: a static L (None: L from the bias's dim); cache: f32 or bf16."""
    return (f"{CHUNK_DECL_PREFIX}{'' if cache == 'f32' else cache + '_'}{hq}x{hk}x{c}x{cm}x{d}"
            + ("" if length is None else f"_L{length}"))


def _lower_chunk_attention(module, op, declared: set) -> None:
    """`llmc::attn_chunk(q [1, Hq, C, D], kc [1, Hk, Cm, D], vc, bias [1, 1, C, L])` -> a call of a declared
    function on builtin tensors (L dynamic or static)."""
    from torch_mlir import ir

    from llmc.passes._base import vtensor_dims
    from llmc.passes.chunk_attention_kernel import shape_refusal

    q, kc, vc, bias = op.operands
    (qs, qe), (ks, ke), (vs, ve), (bs, be) = (vtensor_dims(str(t.type)) for t in (q, kc, vc, bias))
    ok = (len(qs) == 4 and len(ks) == 4 and len(bs) == 4 and (qe, be) == ("f32",) * 2 and ke == ve
          and ke in ATTN_CACHE_ELEMENTS and ks == vs
          and all(x.isdigit() for x in (*qs, *ks)) and qs[0] == ks[0] == "1" and qs[3] == ks[3]
          and bs[:3] == ["1", "1", qs[2]])
    hq, hk, c, cm, d = (int(x) for x in (qs[1], ks[1], qs[2], ks[2], qs[3])) if ok else (0, 1, 0, 0, 0)
    why = shape_refusal(hq, hk, d) if ok else None
    if not ok or why:
        raise CompileError(f"llmc::attn_chunk takes q [1, Hq, C, D], caches [1, Hk, Cm, D] (f32 or bf16, both alike) and a "
                           f"bias [1, 1, C, L], q and the bias f32, all static but L, heads the kernel holds"
                           f"{f' (not {why})' if why else ''}; got {q.type}, {kc.type}, {vc.type}, {bias.type}")
    length = int(bs[3]) if bs[3].isdigit() else None
    name = chunk_attention_declaration_name(hq, hk, c, cm, d, length, ke)
    t_q, t_c = ir.Type.parse(f"tensor<1x{hq}x{c}x{d}xf32>"), ir.Type.parse(f"tensor<1x{hk}x{cm}x{d}x{ke}>")
    t_b = ir.Type.parse(f"tensor<1x1x{c}x{'?' if length is None else length}xf32>")
    _replace_with_call(module, op, name, [t_q, t_c, t_c, t_b], t_q, declared)


# ---------------------------------------------------------------------------------------------
# 2. on the text for iree-compile: bodies and the executable

_DECL = re.compile(rf"^(\s*)func\.func private @({DECL_PREFIX}({'|'.join(KINDS)})_(\d+)x(\d+))\(.*$", re.M)
_ATTN_DECL = re.compile(rf"^(\s*)func\.func private @({ATTN_DECL_PREFIX}(?:(bf16)_)?(\d+)x(\d+)x(\d+)x(\d+)(?:_L(\d+))?)\(.*$", re.M)
_CHUNK_DECL = re.compile(rf"^(\s*)func\.func private @({CHUNK_DECL_PREFIX}(?:(bf16)_)?(\d+)x(\d+)x(\d+)x(\d+)x(\d+)(?:_L(\d+))?)\(.*$", re.M)
_GEMM_DECL = re.compile(rf"^(\s*)func\.func private @({GEMM_DECL_PREFIX}({'|'.join(GEMM_KINDS)})_(\d+|D)x(\d+)x(\d+))\(.*$", re.M)


def groups_per_workgroup(kind: str, groups: int, k: int) -> int:
    """How many groups of G channels one workgroup computes: about BYTES_PER_WORKGROUP of weight, fewer
    when that would leave under MIN_WORKGROUPS workgroups, in whole steps of the C loop's side-by-side
    form (2; that form runs for bf16 groups of 64 KiB or more only, and the decode timings in
    docs/targets.md were taken with this rounding everywhere)."""
    elem, group = KINDS[kind]
    step = 2
    per = max(1, BYTES_PER_WORKGROUP // (k * group * (1 if elem == "i8" else 2)))
    per = min(per, -(-groups // MIN_WORKGROUPS))
    return -(-per // step) * step


def bf16_matvec(arch: str | None) -> tuple[int, str]:
    """(pair_min_k, C function) of the bf16 one-row product in a module built for llvm-cpu `--arch arch`,
    from its CPUs as iree-compile resolves them (`host` is this machine's; each CPU asked once). The stream
    threshold: the CPUs' own by name (BF16_PAIR_MIN_K_BY_CPU), the default unless all agree. The function:
    the AVX-512F form when every CPU has avx512f, else the AVX2 one. None: the defaults."""
    if not arch:
        return BF16_PAIR_MIN_K, BF16_MATVEC_FUNCTION
    from llmc.compiler import targets

    resolved = [targets.llvm_cpu_features(cpu) + (cpu,) for cpu in targets.cpu_variants(arch)]
    wide = all("avx512f" in features for _, features, _ in resolved)
    return (_agreed(resolved, BF16_PAIR_MIN_K_BY_CPU, BF16_PAIR_MIN_K),
            BF16_MATVEC_FUNCTION_AVX512 if wide else BF16_MATVEC_FUNCTION)


def _agreed(resolved: list[tuple[str, tuple[str, ...], str]], by_cpu: dict[str, int], default: int) -> int:
    """A per-CPU setting of a module built for the CPUs `resolved` ((name, features, arch) each): their own
    value from `by_cpu` (by resolved name, else the arch as given) where all agree, else `default`."""
    chosen = {by_cpu.get(name or cpu, default) for name, _, cpu in resolved}
    return chosen.pop() if len(chosen) == 1 else default


def matvec_prefetch(arch: str | None) -> int:
    """The fp8 and int8 one-row loop's prefetch distance in a module built for llvm-cpu `--arch arch`: the CPUs'
    own (MATVEC_PREFETCH_BY_CPU, by name as iree-compile resolves them), the default unless all agree."""
    if not arch:
        return MATVEC_PREFETCH
    from llmc.compiler import targets

    resolved = [targets.llvm_cpu_features(cpu) + (cpu,) for cpu in targets.cpu_variants(arch)]
    return _agreed(resolved, MATVEC_PREFETCH_BY_CPU, MATVEC_PREFETCH)


def fp8_pairs(arch: str | None) -> bool:
    """Whether every CPU of llvm-cpu `--arch arch` (as iree-compile resolves them) has FP8_PAIR_FEATURES: the
    fp8 weights of such a module get the pair layout and the dot-product loop (compiler/pipeline.py)."""
    if not arch:
        return False
    from llmc.compiler import targets

    return all(set(FP8_PAIR_FEATURES) <= set(targets.llvm_cpu_features(cpu)[1]) for cpu in targets.cpu_variants(arch))


def _bf16_bits(out: str, bits: str) -> list[str]:
    """Lines rounding the f32 bits `bits` (i32) to bf16's, nearest even, into `out` (i32, the top 16 bits):
    add 0x7FFF plus the lowest kept bit, shift down 16 (inf stays inf; a NaN stays a NaN unless its bits
    are 0xFFFF8000 or more)."""
    return [f"    {out}s = arith.shrui {bits}, %c16 : i32",
            f"    {out}o = arith.andi {out}s, %c1 : i32",
            f"    {out}a = arith.addi {bits}, %c7fff : i32",
            f"    {out}b = arith.addi {out}a, {out}o : i32",
            f"    {out} = arith.shrui {out}b, %c16 : i32"]


def fp8_x_halves(k: int) -> list[str]:
    """Lines computing %xq: tensor<2xKxi16>, x' = x * FP8_X_SCALE as two bf16 halves, hi = bf16(x') (row 0)
    and lo = bf16(x' - hi) (row 1), from %x: tensor<1xKxf32> (the dot-product fp8 loop's x), each rounded to
    nearest even, so |x' - (hi + lo)| <= 2^-17 |x'|. The rounding is integer arithmetic on the f32 bits
    (_bf16_bits): written as arith.truncf and arith.extf, IREE 3.13's llvm-cpu code gave lo = 0 for every
    element (iree-opt --canonicalize alone keeps the subtraction). One elementwise op, which IREE can fuse
    into the dispatch that makes x."""
    t = f"tensor<2x{k}xi16>"
    return [
        f"  %xe = tensor.empty() : {t}",
        "  %xq = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], "
        f'iterator_types = ["parallel", "parallel"]}} ins(%x : tensor<1x{k}xf32>) outs(%xe : {t}) {{',
        "  ^bb0(%xa: f32, %xo: i16):",
        f"    %xs = arith.constant {FP8_X_SCALE:.1f} : f32",
        "    %x0 = arith.constant 0 : index",
        "    %c1 = arith.constant 1 : i32",
        "    %c16 = arith.constant 16 : i32",
        "    %c7fff = arith.constant 32767 : i32",
        "    %xv = arith.mulf %xa, %xs : f32",
        "    %xvb = arith.bitcast %xv : f32 to i32",
        *_bf16_bits("%xh", "%xvb"),
        "    %xhw = arith.shli %xh, %c16 : i32",
        "    %xhf = arith.bitcast %xhw : i32 to f32",
        "    %xd = arith.subf %xv, %xhf : f32",
        "    %xdb = arith.bitcast %xd : f32 to i32",
        *_bf16_bits("%xl", "%xdb"),
        "    %xr = linalg.index 0 : index",
        "    %xf = arith.cmpi eq, %xr, %x0 : index",
        "    %xb = arith.select %xf, %xh, %xl : i32",
        "    %xi = arith.trunci %xb : i32 to i16",
        "    linalg.yield %xi : i16",
        f"  }} -> {t}",
    ]


def _matvec_extra(kind: str) -> list[str]:
    """Index operands a matvec kind's C function takes after (k, groups, per_wg, wg)."""
    return {"bf16": ["%pairk"], "fp8": ["%ahead"], "int8": ["%ahead"]}.get(kind, [])


def _definition(indent: str, name: str, kind: str, groups: int, k: int, m: int | str | None = None,
                pair_min_k: int = BF16_PAIR_MIN_K, ahead: int = MATVEC_PREFETCH) -> str:
    """The body of a declared kernel function: a flow.dispatch of @matvec_<kind> (m None: x [1, K]) or
    @gemm_<kind> (x [m, K], m passed to the C function too; m "D": the row count is x's dynamic dim).
    pair_min_k: the bf16 matvec's threshold for reading two groups side by side (bf16_matvec); ahead: the fp8
    and int8 matvec's prefetch distance (matvec_prefetch)."""
    elem, group = (KINDS if m is None else GEMM_LAYOUTS)[kind]
    rows = 1 if m is None else "?" if m == "D" else m
    dims = "{%m}" if m == "D" else ""  # a dynamic tensor's size operand in flow.dispatch's type list
    tx, tp, ty = f"tensor<{rows}x{k}xf32>", f"tensor<{groups}x{k}x{group}x{elem}>", f"tensor<{rows}x{groups * group}xf32>"
    halves = m is None and kind in PAIR_LAYOUTS  # the dot-product loop takes x as [2, K] bf16 halves (fp8_x_halves)
    operand, to = ("%xq", f"tensor<2x{k}xi16>") if halves else ("%x", tx)
    per = groups_per_workgroup(kind, groups, k) if m is None else gemm_groups_per_workgroup(kind, groups)
    op, sizes = ("matvec", ["%k", "%g", "%per", *_matvec_extra(kind)]) if m is None else ("gemm", ["%m", "%k", "%g", "%per"])
    row_count = ([] if m is None else
                 ["  %c0 = arith.constant 0 : index", f"  %m = tensor.dim %x, %c0 : {tx}"] if m == "D" else
                 [f"  %m = arith.constant {m} : index"])
    lines = [
        f"func.func private @{name}(%x: {tx}, %p: {tp}) -> {ty} {{",
        *row_count,
        f"  %k = arith.constant {k} : index",
        f"  %g = arith.constant {groups} : index",
        f"  %per = arith.constant {per} : index",
        *([f"  %pairk = arith.constant {pair_min_k} : index"] if "%pairk" in sizes else []),
        *([f"  %ahead = arith.constant {ahead} : index"] if "%ahead" in sizes else []),
        *(fp8_x_halves(k) if halves else []),
        f"  %y = flow.dispatch @{EXECUTABLE}::@{op}_{kind}[%g, %per]({operand}, %p, {', '.join(sizes)}) : "
        f"({to}{dims}, {tp}, {', '.join(['index'] * len(sizes))}) -> {ty}{dims}",
        f"  return %y : {ty}",
        "}",
    ]
    return "\n".join(indent + line for line in lines)


def _attention_definition(indent: str, name: str, hq: int, hk: int, c: int, d: int, length: int | None,
                          cache: str = "f32") -> str:
    """The body of a declared attention function: a flow.dispatch of @attn_decode (@attn_decode_bf16 over a
    bf16 cache), one workgroup per KV head, L read from the bias (its dynamic last dim, or the static one)."""
    consts = [("hk", hk), ("g", hq // hk), ("c", c), ("d", d)]
    return _attention_dispatch(indent, name, _attention_export(cache), f"tensor<1x{hq}x1x{d}xf32>",
                               f"tensor<1x{hk}x{c}x{d}x{cache}>", f"tensor<1x1x1x{'?' if length is None else length}xf32>",
                               length, "hk", consts)


def _attention_dispatch(indent: str, name: str, export: str, tq: str, tc: str, tb: str, length: int | None,
                        workgroups: str | int, consts: list[tuple[str, int]]) -> str:
    """A declared attention function's body (q, kc, vc, bias -> y): L from the bias's last dim (dynamic, or
    `length`), the index constants `consts` declared in order and passed after L, and a flow.dispatch of
    `export` over `workgroups` workgroups: the name of one of consts, or a count (%n, not passed)."""
    row_count = (["  %c3 = arith.constant 3 : index", f"  %l = tensor.dim %b, %c3 : {tb}"] if length is None else
                 [f"  %l = arith.constant {length} : index"])
    dims = "{%l}" if length is None else ""
    passed = [n for n, _ in consts]
    declared = consts if isinstance(workgroups, str) else [("n", workgroups), *consts]
    lines = [
        f"func.func private @{name}(%q: {tq}, %k: {tc}, %v: {tc}, %b: {tb}) -> {tq} {{",
        *row_count,
        *(f"  %{n} = arith.constant {value} : index" for n, value in declared),
        f"  %y = flow.dispatch @{EXECUTABLE}::@{export}[%{workgroups if isinstance(workgroups, str) else 'n'}](%q, %k, %v, %b, %l, {', '.join('%' + n for n in passed)}) : "
        f"({tq}, {tc}, {tc}, {tb}{dims}, {', '.join(['index'] * (1 + len(passed)))}) -> {tq}",
        f"  return %y : {tq}",
        "}",
    ]
    return "\n".join(indent + line for line in lines)


def _product(name: str, symbols: list[str]) -> str:
    """`%name = affine.apply` of the product of the index values `symbols`."""
    syms = ", ".join(f"s{i}" for i in range(len(symbols)))
    prod = " * ".join(f"s{i}" for i in range(len(symbols)))
    return f"      %{name} = affine.apply affine_map<()[{syms}] -> ({prod})>()[{', '.join('%' + s for s in symbols)}]"


def _attention_executable(fn: str, ce: str, workload: str, params: list[str], q_size: list[str], k_size: list[str],
                          b_size: list[str], args: list[str]) -> tuple[str, str]:
    """The export and function of an attention kernel @fn calling llmc_<fn>(q, k, v, bias, y, *args): q and y
    f32, k and v of element `ce`, the bias f32; the bindings' sizes products of the index operands (`params`,
    after L) named in q_size, k_size and b_size; args: index values (%wg: the workgroup id)."""
    export = f"""\
  stream.executable.export public @{fn} workgroups(%{workload}: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    stream.return %{workload}, %c1, %c1 : index, index, index
  }}"""
    mems = f"memref<?xf32>, memref<?x{ce}>, memref<?x{ce}>, memref<?xf32>, memref<?xf32>, {', '.join(['index'] * len(args))}"
    bindings = "%bq: !stream.binding, %bk: !stream.binding, %bv: !stream.binding, %bb: !stream.binding, %by: !stream.binding"
    lines = [
        f"    func.func private @llmc_{fn}({mems}) attributes {{hal.import.static}}",
        f"    func.func @{fn}({bindings}, {', '.join(f'%{p}: index' for p in ['l', *params])}) {{",
        "      %c0 = arith.constant 0 : index",
        "      %wg = stream.dispatch.workgroup.id[0] : index",
        _product("nq", q_size), _product("nk", k_size), _product("nb", b_size),
        "      %q = stream.binding.subspan %bq[%c0] : !stream.binding -> memref<?xf32>{%nq}",
        f"      %k = stream.binding.subspan %bk[%c0] : !stream.binding -> memref<?x{ce}>{{%nk}}",
        f"      %v = stream.binding.subspan %bv[%c0] : !stream.binding -> memref<?x{ce}>{{%nk}}",
        "      %b = stream.binding.subspan %bb[%c0] : !stream.binding -> memref<?xf32>{%nb}",
        "      %y = stream.binding.subspan %by[%c0] : !stream.binding -> memref<?xf32>{%nq}",
        f"      func.call @llmc_{fn}(%q, %k, %v, %b, %y, {', '.join('%' + a for a in args)}) : ({mems}) -> ()",
        "      return",
        "    }",
    ]
    return export, "\n".join(lines)


def _attention_executable_parts(cache: str = "f32") -> tuple[str, str]:
    """The export and function of @attn_decode (f32 cache) or @attn_decode_bf16 (the cache as i16 bits):
    llmc_attn_decode(q, k, v, bias, y, l, g, c, d, h), one workgroup per KV head h."""
    return _attention_executable(_attention_export(cache), ATTN_CACHE_ELEMENTS[cache], "hk", ["hk", "g", "c", "d"],
                                 ["hk", "g", "d"], ["hk", "c", "d"], ["l"], ["l", "g", "c", "d", "wg"])


def _chunk_export(cache: str) -> str:
    """The executable export (and C function, llmc_ + it) of the chunk attention kernel over this cache element."""
    return "attn_chunk" + ("" if cache == "f32" else "_" + cache)


def _chunk_attention_definition(indent: str, name: str, hq: int, hk: int, c: int, cm: int, d: int, length: int | None,
                                cache: str = "f32") -> str:
    """The body of a declared chunk attention function: a flow.dispatch of @attn_chunk (@attn_chunk_bf16 over a
    bf16 cache), a workgroup per KV head and block of query positions, L read from the bias."""
    from llmc.passes.chunk_attention_kernel import rows_per_workgroup

    rows = rows_per_workgroup(hq // hk, d)
    consts = [("hk", hk), ("g", hq // hk), ("c", c), ("cm", cm), ("d", d), ("np", rows)]
    return _attention_dispatch(indent, name, _chunk_export(cache), f"tensor<1x{hq}x{c}x{d}xf32>",
                               f"tensor<1x{hk}x{cm}x{d}x{cache}>", f"tensor<1x1x{c}x{'?' if length is None else length}xf32>",
                               length, hk * -(-c // rows), consts)


def _chunk_attention_executable_parts(cache: str = "f32") -> tuple[str, str]:
    """The export and function of @attn_chunk (f32 cache) or @attn_chunk_bf16 (the cache as i16 bits):
    llmc_attn_chunk(q, k, v, bias, y, l, g, c, cm, d, np, wg)."""
    return _attention_executable(_chunk_export(cache), ATTN_CACHE_ELEMENTS[cache], "n", ["hk", "g", "c", "cm", "d", "np"],
                                 ["hk", "g", "c", "d"], ["hk", "cm", "d"], ["c", "l"], ["l", "g", "c", "cm", "d", "np", "wg"])


def _export(function: str) -> str:
    """An executable export whose workgroup count is ceil(groups / per), one dimension (every kernel's)."""
    return f"""\
  stream.executable.export public @{function} workgroups(%g: index, %per: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    %n = affine.apply affine_map<()[s0, s1] -> (s0 ceildiv s1)>()[%g, %per]
    stream.return %n, %c1, %c1 : index, index, index
  }}"""


def gemm_groups_per_workgroup(kind: str, groups: int) -> int:
    """Groups one workgroup computes, for every row (a group's work, M x K x G multiply-adds, is large next
    to a workgroup's cost at any M a prefill chunk has), in whole steps of the C loop (GEMM_GROUP_MULTIPLE).

    The count of workgroups is set by how IREE 3.13's local-task hands them out (block_processor.c
    `iree_hal_cmd_dispatch_tiles_per_reservation`): one at a time while a dispatch has fewer than 8 per
    worker, else 8 at a claim. At 2 workers, 16 workgroups were 2 claims of 8, one a worker, so a worker
    that started late or ran slower held the product up by its whole half. So: a product with many
    groups gets one step of groups a workgroup (>= GEMM_MANY_WORKGROUPS workgroups: 8 or more claims),
    any other at most GEMM_FEW_WORKGROUPS (handed out one at a time at 2 workers or more).
    small-125m bf16 prefill at 2 threads: docs/targets.md "Prefill kernels at two threads"."""
    step = GEMM_GROUP_MULTIPLE.get(kind, 1)
    if groups >= GEMM_MANY_WORKGROUPS * step:
        return step
    per = max(1, -(-groups // GEMM_FEW_WORKGROUPS))
    return -(-per // step) * step


def _gemm_executable_parts(kind: str) -> tuple[str, str]:
    elem, group = GEMM_LAYOUTS[kind]
    export = _export(f"gemm_{kind}")
    func = f"""\
    func.func private @llmc_gemm_{kind}(memref<?xf32>, memref<?x{elem}>, memref<?xf32>, index, index, index, index, index) attributes {{hal.import.static}}
    func.func @gemm_{kind}(%bx: !stream.binding, %bp: !stream.binding, %by: !stream.binding, %m: index, %k: index, %g: index, %per: index) {{
      %c0 = arith.constant 0 : index
      %wg = stream.dispatch.workgroup.id[0] : index
      %nx = affine.apply affine_map<()[s0, s1] -> (s0 * s1)>()[%m, %k]
      %np = affine.apply affine_map<()[s0, s1] -> (s0 * s1 * {group})>()[%g, %k]
      %ny = affine.apply affine_map<()[s0, s1] -> (s0 * s1 * {group})>()[%m, %g]
      %x = stream.binding.subspan %bx[%c0] : !stream.binding -> memref<?xf32>{{%nx}}
      %p = stream.binding.subspan %bp[%c0] : !stream.binding -> memref<?x{elem}>{{%np}}
      %y = stream.binding.subspan %by[%c0] : !stream.binding -> memref<?xf32>{{%ny}}
      func.call @llmc_gemm_{kind}(%x, %p, %y, %m, %k, %g, %per, %wg) : (memref<?xf32>, memref<?x{elem}>, memref<?xf32>, index, index, index, index, index) -> ()
      return
    }}"""
    return export, func


def _executable(obj: Path, kinds: list[str], gemm_kinds: list[str] = (), attention: tuple[str, ...] = (),
                bf16_function: str = BF16_MATVEC_FUNCTION, chunk_attention: tuple[str, ...] = ()) -> str:
    """attention, chunk_attention: the KV cache element types whose decode-step or prefill-chunk attention
    kernel the module calls (f32, bf16); bf16_function: the C function the bf16 matvec calls (bf16_matvec)."""
    exports, funcs = [], []
    for cache in attention:
        export, func = _attention_executable_parts(cache)
        exports.append(export)
        funcs.append(func)
    for cache in chunk_attention:
        export, func = _chunk_attention_executable_parts(cache)
        exports.append(export)
        funcs.append(func)
    for kind in gemm_kinds:
        export, func = _gemm_executable_parts(kind)
        exports.append(export)
        funcs.append(func)
    for kind in kinds:
        elem, group = KINDS[kind]
        extra = _matvec_extra(kind)
        idx = ", index" * len(extra)
        args, params = "".join(f", {a}" for a in extra), "".join(f", {a}: index" for a in extra)
        c_function = bf16_function if kind == "bf16" else f"llmc_matvec_{kind}"
        halves = kind in PAIR_LAYOUTS  # x as [2, K] bf16 bits (fp8_x_halves)
        xe, nx = ("i16", "%nx") if halves else ("f32", "%k")
        x_size = "\n      %nx = affine.apply affine_map<()[s0] -> (s0 * 2)>()[%k]" if halves else ""
        exports.append(_export(f"matvec_{kind}"))
        funcs.append(f"""\
    func.func private @{c_function}(memref<?x{xe}>, memref<?x{elem}>, memref<?xf32>, index, index, index, index{idx}) attributes {{hal.import.static}}
    func.func @matvec_{kind}(%bx: !stream.binding, %bp: !stream.binding, %by: !stream.binding, %k: index, %g: index, %per: index{params}) {{
      %c0 = arith.constant 0 : index
      %wg = stream.dispatch.workgroup.id[0] : index
      %np = affine.apply affine_map<()[s0, s1] -> (s0 * s1 * {group})>()[%g, %k]
      %ny = affine.apply affine_map<()[s0] -> (s0 * {group})>()[%g]{x_size}
      %x = stream.binding.subspan %bx[%c0] : !stream.binding -> memref<?x{xe}>{{{nx}}}
      %p = stream.binding.subspan %bp[%c0] : !stream.binding -> memref<?x{elem}>{{%np}}
      %y = stream.binding.subspan %by[%c0] : !stream.binding -> memref<?xf32>{{%ny}}
      func.call @{c_function}(%x, %p, %y, %k, %g, %per, %wg{args}) : (memref<?x{xe}>, memref<?x{elem}>, memref<?xf32>, index, index, index, index{idx}) -> ()
      return
    }}""")
    target = '#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {}>'
    # By path: IREE 3.13's linker ignores an object's embedded `data` ("iree-lld: error: undefined
    # symbol"), so a saved reproducer needs the cached object file in place.
    objects = f'#hal.executable.objects<{{{target} = [#hal.executable.object<{{path = "{obj}"}}>]}}>'
    return "\n".join([
        f"stream.executable private @{EXECUTABLE} attributes {{hal.executable.objects = {objects}}} {{",
        *exports,
        "  builtin.module {",
        *funcs,
        "  }",
        "}",
    ])


def link(mlir: str, arch: str | None = None) -> str:
    """`mlir` with each kernel declaration given its dispatch body and the executable added; the
    text unchanged when it declares none. arch: the module's llvm-cpu --arch, read only where a one-row
    product needs it: bf16's stream count and C function (bf16_matvec), fp8's and int8's prefetch distance
    (matvec_prefetch); None: the defaults (AVX2)."""
    found = list(_DECL.finditer(mlir))
    found_gemm = list(_GEMM_DECL.finditer(mlir))
    found_attn = list(_ATTN_DECL.finditer(mlir))
    found_chunk = list(_CHUNK_DECL.finditer(mlir))
    if not found and not found_gemm and not found_attn and not found_chunk:
        return mlir
    mlir = _CHUNK_DECL.sub(lambda m: _chunk_attention_definition(m.group(1), m.group(2), *(int(m.group(i)) for i in range(4, 9)),
                                                               int(m.group(9)) if m.group(9) else None, m.group(3) or "f32"), mlir)
    mlir = _ATTN_DECL.sub(lambda m: _attention_definition(m.group(1), m.group(2), *(int(m.group(i)) for i in range(4, 8)),
                                                          int(m.group(8)) if m.group(8) else None, m.group(3) or "f32"), mlir)
    pair_min_k, bf16_function = BF16_PAIR_MIN_K, BF16_MATVEC_FUNCTION
    if any(m.group(3) == "bf16" for m in found):
        pair_min_k, bf16_function = bf16_matvec(arch)
    ahead = matvec_prefetch(arch) if any(m.group(3) in ("fp8", "int8") for m in found) else MATVEC_PREFETCH
    out = _DECL.sub(lambda m: _definition(m.group(1), m.group(2), m.group(3), int(m.group(4)), int(m.group(5)),
                                          pair_min_k=pair_min_k, ahead=ahead), mlir)
    out = _GEMM_DECL.sub(lambda m: _definition(m.group(1), m.group(2), m.group(3), int(m.group(5)), int(m.group(6)),
                                               m="D" if m.group(4) == "D" else int(m.group(4))), out)
    end = out.rstrip().rfind("}")  # the module's own closing brace: the executable goes inside it
    return out[:end] + _executable(build_object(), sorted({m.group(3) for m in found}),
                                   sorted({m.group(3) for m in found_gemm}),
                                   attention=tuple(sorted({m.group(3) or "f32" for m in found_attn})),
                                   bf16_function=bf16_function,
                                   chunk_attention=tuple(sorted({m.group(3) or "f32" for m in found_chunk}))) + "\n" + out[end:]
