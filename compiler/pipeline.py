"""Which passes run, in which order, for a target and dtype; and the runners that apply them.

The lists below are the whole pipeline, readable in one place. A pass runs when it is listed here and
its `requires` holds for the resolved target (typed capabilities) and dtype; otherwise it is skipped
with the reason logged and recorded in the manifest. Adding a pass: one file in passes/, one line
here, one test in tests/passes/.

Phases, in order (compiler/lower.py drives them):
  0. source  - on a user's f32 ExportedProgram before llmc re-exports it in another dtype
  1. graph   - on the exported program: the decomposition to the op set torch-mlir lowers (its own
               table, with SDPA kept whole) merged with every DecompositionPass into ONE retrace,
               then any other graph passes in list order
  2. import  - torch-mlir's FX importer; weights become external parameters (compiler/importer.py)
  3. ir      - on the torch-dialect MLIR module
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

import llmc.passes  # noqa: F401  (registers every pass)
from llmc.errors import PassError
from llmc.passes._base import REGISTRY, DecompositionPass, PassContext
from llmc.passes._base import PassError as _PassRefusal
from llmc.passes._packed import KERNEL_OPTION, PAIRS_OPTION
from llmc.passes.decode_attention_kernel import KERNEL_UNAVAILABLE_OPTION as ATTENTION_KERNEL_OPTION
from llmc.passes.f32_gemm_weights import FIXED_ROWS_OPTION

log = logging.getLogger("llmc.pipeline")

SOURCE_PASSES: list[str] = [
    "retarget-casts",  # f16/bf16 from an f32 .pt2: drop f32 -> f32 casts and dtype asserts
]
GRAPH_PASSES: list[str] = [
    "prims-as-aten",  # prims.squeeze/view_of/split_dim/prod a model calls: ATen ops (run_decompositions refuses aliasing prims)
    "slice-copy",  # torch-mlir has no aten.slice_copy lowering
    "zero-k-products",  # mm/bmm with K = 0 (IREE 3.13 is killed by SIGFPE): the operands' sums multiplied
    "narrow-int-products",  # int8/uint8/int16 mm/bmm in int32, wrapped back (torch-mlir's int8 accumulator crashes iree-compile)
    "vecmat-as-mv",  # llvm-cpu: vector x matrix with a dynamic N as mv of the transpose (IREE's global-opt data tiling returns it padded)
    "decompose-moe",  # MoE experts (transformers 5): histc, _grouped_mm, grouped_mm_fallback as gathers / masked bmm
    "avg-pool-forms",  # avg pooling of unbatched inputs, and ceil_mode without counting padding, in forms torch-mlir lowers right
    "adaptive-max-pool",  # adaptive max pooling as window gathers + max per axis (IREE rejects torch-mlir's pooling form)
    "scatter-reduce",  # scatters IREE fails or crashes on (include_self=False dynamic, negative dim, 0-d) or gets wrong (int mean, bool, uint8 max): eager's fill + scatter with self, dim % ndim
    "dynamic-split",  # split_with_sizes with symbolic sizes (chunk of a dynamic dim) as slices: torch-mlir lowers constant sizes only
    "isfinite",  # aten.isfinite (no torch-mlir lowering) as not isnan(x) and |x| != inf
    "int-elementwise",  # clamp of ints with float bounds, integer pow, mixed-dtype threshold_backward: torch-mlir lowers them wrongly or not at all
    "scaled-mm",  # aten._scaled_mm (torch-mlir has no lowering): fp8 widened, f32 product, scales, out_dtype
    "multinomial",  # aten.multinomial as inverse-CDF counts / Gumbel top-k (IREE fails on torch-mlir's dynamic form)
    "sort-by-rank",  # aten.sort/topk/kthvalue as comparison counts: IREE sorts an iota in place that it shares with equal aranges (iree#24665)
    "decode-attention-kernel",  # llvm-cpu with llmc's C kernels: a decode step's attention over the f32 cache as one C call
    "chunk-attention-kernel",  # llvm-cpu with llmc's C kernels: a prefill chunk's attention over the cache as one C call
    "decompose-attention",  # llvm-cpu, SPIR-V: SDPA written out (decode steps as f32 multiply + sum); hip/cuda keep it whole
    "qdq-wide-float",  # PT2E int16/int32 quantize/dequantize as f32 math (the integer path is for 8-bit operands)
    "qdq-contractions",  # PT2E: each matmul/conv reads its dequantize directly (IREE then forms i8 x i8 -> i32); per-layer schemes for the manifest
    "int8-signed",  # PT2E uint8 activations as int8 (zero point - 128, exact): llvm-cpu's fast integer kernels are signed
    "qdq-float",  # PT2E on archs without int64 (IREE's integer contractions need it) or --int8-math float: Q/DQ as f32 math
    "dtype-harmony",  # mm/addmm with operands of different float dtypes: explicit casts (torch-mlir rejects them)
    "bf16-weights",  # SPIR-V and cpu bf16: weights stored as int16 bits, widened with integer ops; f32 math
    "fp8-weights",  # --dtype fp8: linear weights as E4M3 bytes + per-channel scales, decoded where used
    "int8-weights",  # --dtype int8: linear weights as int8 + per-channel scales (fp8-weights' body), converted where used
    "f32-gemm-weights",  # cpu f32 with a prefill chunk or buckets: linear weights in 16-channel panels for llmc's C GEMM
    "bf16-outputs",  # cpu bf16 (f32 math): untied f32 outputs returned in bf16, as eager bf16 returns them
]
IR_PASSES: list[str] = [
    "log10-to-log",  # llvm-cpu links no log10f: log(x) / ln(10)
    "f64-math",  # llvm-cpu links no libm: f64 sin/cos/tan/asin/acos/atan/atan2/tanh/log2/polar as f64 arithmetic
    "bitcast-elementwise",  # same-width view.dtype as a fusable elementwise bitcast (the fp8/bf16 weight decodes)
]


def base_decompositions() -> dict:
    """torch-mlir's decomposition table with scaled-dot-product attention kept whole.

    GPU targets hand SDPA to IREE, which forms its fused attention op from it; the decompose-attention
    pass decomposes it where the target wants that."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    return {k: v for k, v in get_decomposition_table().items() if "scaled_dot_product" not in str(k)}


@dataclasses.dataclass
class Plan:
    """The pass instances for one compile (one instance per pass, shared by every entry point)."""

    ctx: PassContext
    source: list
    graph: list
    ir: list
    skipped: list[dict]

    @property
    def passes(self) -> list:
        return [*self.source, *self.graph, *self.ir]

    def stats(self) -> list[dict]:
        return [p.stats.as_dict() for p in self.passes]


def build(target, options: dict | None = None, only: list[str] | None = None) -> Plan:
    """The plan for a resolved target (compiler.targets.ResolvedTarget).

    only: run exactly these passes (in pipeline order when listed there), ignoring gating; llmc-opt's
    `--pass` uses it.
    """
    from llmc.passes._scratch import Scratch

    opts = {**dict(getattr(target, "pass_options", ())), **dict(options or {})}
    from llmc.compiler import ukernels

    dtype = getattr(target, "dtype", None)
    llvm_cpu = getattr(target, "caps", None) is not None and target.caps.backend == "llvm-cpu"
    kernels_why_not = ukernels.unavailable(target) if llvm_cpu else "not an llvm-cpu target"  # asked once a plan
    if KERNEL_OPTION not in opts and (dtype in ukernels.KINDS or (dtype == "f32" and opts.get(FIXED_ROWS_OPTION))):
        why_not = kernels_why_not if dtype in ukernels.KINDS else ukernels.f32_gemm_unavailable(target)
        if why_not:
            (log.warning if why_not.startswith(ukernels.NO_COMPILER) else log.info)(
                "cpu C kernels not used (decode steps and prefill chunks slower): %s", why_not)
        opts[KERNEL_OPTION] = why_not is None
    if PAIRS_OPTION not in opts and dtype == "fp8" and opts.get(KERNEL_OPTION):
        opts[PAIRS_OPTION] = ukernels.fp8_pairs(target.arch)  # the fp8 dot-product loop's layout (passes/_packed.py)
    if ATTENTION_KERNEL_OPTION not in opts and llvm_cpu:
        opts[ATTENTION_KERNEL_OPTION] = kernels_why_not or ""  # passes/decode_attention_kernel.py's gate
    ctx = PassContext(target=target, dtype=target.dtype, options=opts, scratch=Scratch())
    phases = {"source": [], "graph": [], "ir": []}
    skipped = []
    names = [*SOURCE_PASSES, *GRAPH_PASSES, *IR_PASSES]
    if only is not None:
        unknown = [n for n in only if n not in REGISTRY]
        if unknown:
            raise PassError(f"unknown pass {unknown[0]!r}; known passes: {', '.join(sorted(REGISTRY))}")
        names = [n for n in names if n in only] + [n for n in only if n not in names]
    for name in names:
        cls = REGISTRY[name]
        reason = None if only is not None else cls.requires.why_not(ctx)
        if reason:
            log.info("pass %s skipped: %s", name, reason)
            skipped.append({"name": name, "reason": reason})
            continue
        phases[cls.kind].append(cls(ctx))
    return Plan(ctx, phases["source"], phases["graph"], phases["ir"], skipped)


class Dumper:
    """--dump-ir DIR: the program after every step, as NN-<entry>-<step>.txt (FX) / NN-<step>.mlir."""

    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.n = 0
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, step: str, text_fn, suffix: str = ".mlir") -> None:
        if self.folder is None:
            return
        (self.folder / f"{self.n:02d}-{step}{suffix}").write_text(text_fn())
        self.n += 1

    @staticmethod
    def last_mlir(folder: Path) -> Path:
        """The highest-numbered .mlir a --dump-ir folder holds: the IR iree-compile was given."""
        return max(Path(folder).glob("*.mlir"), key=lambda p: int(p.name.split("-", 1)[0]))


def _refusal(p, e: Exception) -> PassError:
    return PassError(f"pass {p.name}: {e}")


def run_source(plan: Plan, gm, dump: Dumper | None = None) -> None:
    """Source passes, in place on a GraphModule (ExportedProgram.module())."""
    for p in plan.source:
        try:
            p.run(gm)
        except _PassRefusal as e:
            raise _refusal(p, e) from e
        if dump is not None:
            dump(f"source-{p.name}", lambda: str(gm.graph), ".txt")


def run_graph(plan: Plan, program: torch.export.ExportedProgram, entry: str = "main", dump: Dumper | None = None,
              name_prefix: str = "", tied_outputs=()):
    """Graph passes on an exported program; returns the program to import. name_prefix: what the
    importer strips from its parameter names (export.Exported.strip_prefix); tied_outputs: the user
    outputs (by position) returned into an input's buffer."""
    if dump is not None:
        dump(f"{entry}-export", lambda: str(program.graph), ".txt")
    plan.ctx.entry = entry
    plan.ctx.name_prefix = name_prefix
    plan.ctx.tied_outputs = frozenset(tied_outputs)
    table = base_decompositions()
    merged = [p for p in plan.graph if isinstance(p, DecompositionPass)]
    owner: dict = {}
    for p in merged:
        for op, fn in p.decompositions().items():
            if op in owner:
                raise PassError(f"passes {owner[op]} and {p.name} both decompose {op}; order them as separate graph passes")
            owner[op] = p.name
            table[op] = fn
    for p in merged:
        p.before_decomposing(program)
    try:
        program = program.run_decompositions(table)
    except _PassRefusal as e:
        # One line: torch.fx appends the node and the source traceback to the refusal's message.
        raise PassError(f"graph passes ({', '.join(dict.fromkeys(owner.values()))}): {str(e).strip().splitlines()[0]}") from e
    except Exception as e:
        raise PassError(f"decomposing the exported graph failed: {type(e).__name__}: {e}") from e
    if dump is not None:
        # the passes merged into this one decomposition go in the file's first line: in its name they
        # outgrew the file system's 255 bytes
        dump(f"{entry}-decompose", lambda: f"# decomposition passes: {', '.join(p.name for p in merged)}\n{program.graph}", ".txt")
    for p in plan.graph:
        if p in merged or not p.applies(program):
            continue
        try:
            program = p.run(program)
        except _PassRefusal as e:
            raise _refusal(p, e) from e
        if dump is not None:
            dump(f"{entry}-{p.name}", lambda: str(program.graph), ".txt")
    return program


def run_ir(plan: Plan, module, dump: Dumper | None = None) -> None:
    """IR passes, in place on the torch-dialect module."""
    if dump is not None:
        dump("import", lambda: str(module))
    for p in plan.ir:
        try:
            with module.context:
                p.run(module)
        except _PassRefusal as e:
            raise _refusal(p, e) from e
        if dump is not None:
            dump(p.name, lambda: str(module))
