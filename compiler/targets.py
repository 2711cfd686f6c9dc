"""The target table: every user-facing target name, what it can do (typed), and how IREE is told.

This is the only place that maps llmc's target names (`cpu`, `hip`, `xpu`, `vulkan`, `cuda`) to IREE
devices, backends, flags and capabilities (docs/targets.md). The capabilities are typed fields, read
by the pass pipeline (compiler/pipeline.py: which passes run), by `llmc targets`, by the manifest and
by the runtime's device check; nothing tests prose by prefix. Facts come from measurements with
IREE 3.13 (docs/targets.md):

- llvm-cpu: always name the CPU (`--iree-llvmcpu-target-cpu`; without it code is 38x slower) and
  turn data tiling on for f32 (off by default in 3.13; the largest single gain). Low-precision
  weights need `--iree-dispatch-creation-block-matmul-producer-fusion=false`, or every call writes an
  f32 copy of every weight. Attention is decomposed before IREE: its fused CPU attention op runs ~9x
  slower (the `decompose-attention` pass).
- hip and cuda keep SDPA whole: IREE's fused attention halved prefill time on an H100. IREE's SPIR-V
  backend cannot compile that op, so vulkan/xpu decompose attention as cpu does.
- hip: `--iree-rocm-target` (the `--iree-hip-*` names were removed in 3.12). gfx942 (MI300) accepts
  only E4M3FNUZ fp8, gfx950/gfx12xx only E4M3FN; RDNA3 has no fp8.
- cuda: IREE 3.13's table stops at sm_89; sm_90 gets sm_89's capabilities under its own arch name,
  written into the module as its device target (`module_target`).
- SPIR-V (xpu, vulkan): no bf16 arithmetic (bf16 weights stored as int16 bits, f32 math: the
  `bf16-weights` pass), no fp8 conversion. IREE has no Intel Vulkan target and
  crashes on unknown names, so the Intel profiles are written into the module here. A module built
  for another subgroup size runs silently wrong: the manifest records the sizes and the runtime
  refuses a device without one of them.
- An unknown target or arch is rejected here, before IREE sees it (IREE segfaults on some).
- cpu with several CPUs (`--arch x86-64-v4,x86-64-v3` or the preset `portable`): one module whose
  executables carry a variant per CPU, best first, each but the last guarded by the CPU features it
  was compiled for (`cpu_variant_conditions`; compiler/iree.py inserts the conditions between
  iree-compile's two halves; runtime/module.py warms IREE's CPU data before loading).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import tempfile

from llmc.dtypes import COMPUTE_DTYPES
from llmc.errors import UnsupportedTargetError, UsageError

DTYPES = tuple(COMPUTE_DTYPES)

# CPUs LLVM (as bundled in IREE 3.13) accepts for x86-64, from iree-compile's own list.
X86_CPUS = frozenset(
    """nocona core2 penryn bonnell atom silvermont slm goldmont goldmont-plus tremont nehalem corei7
    westmere sandybridge corei7-avx ivybridge core-avx-i haswell core-avx2 broadwell skylake
    skylake-avx512 skx cascadelake cooperlake cannonlake icelake-client rocketlake icelake-server
    tigerlake sapphirerapids alderlake raptorlake meteorlake arrowlake arrowlake-s lunarlake gracemont
    pantherlake wildcatlake novalake sierraforest grandridge graniterapids graniterapids-d
    emeraldrapids clearwaterforest diamondrapids knl knm k8 athlon64 athlon-fx opteron k8-sse3
    athlon64-sse3 opteron-sse3 amdfam10 barcelona btver1 btver2 bdver1 bdver2 bdver3 bdver4 znver1
    znver2 znver3 znver4 znver5 znver6 x86-64 x86-64-v2 x86-64-v3 x86-64-v4""".split()
)

# `--arch portable`: one module for every x86-64 CPU with AVX2 (2013 on), AVX-512 code where the
# running CPU has it. Best first: the runtime takes the first variant whose features the CPU has.
CPU_PRESETS = {"portable": ("x86-64-v4", "x86-64-v3")}

# CPU features IREE's runtime can be asked about on x86-64 (`hal.device.query key("hal.cpu" :: NAME)`,
# runtime/src/iree/schemas/cpu_feature_bits.inl in IREE 3.13); others always read false.
IREE_X86_QUERY_KEYS = frozenset(
    """sse3 ssse3 sse4.1 sse4.2 sse4a avx fma fma4 xop f16c avx2 avx512f avx512cd avx512vl avx512dq
    avx512bw avx512ifma avx512vbmi avx512vpopcntdq avx512vnni avx512vbmi2 avx512bitalg avx512bf16
    avx512fp16 amx-tile amx-int8 amx-bf16""".split()
)


def cpu_variants(arch: str) -> tuple[str, ...]:
    """The CPUs an llvm-cpu `--arch` names, best first: one, a comma-separated list, or a preset."""
    if arch in CPU_PRESETS:
        return CPU_PRESETS[arch]
    return tuple(a.strip() for a in arch.split(","))


# How a module built for several CPUs carries their code (--cpu-dispatch):
#  - "modules": one .vmfb per CPU, all reading the one .irpa; llmc.load runs the best one this CPU can.
#    Each is exactly the single-CPU build, data tiling included.
#  - "variants": one .vmfb whose executables have a variant per CPU, chosen by IREE at load. IREE
#    3.13 gives a module with several executable targets no data tiling (MaterializeHomogeneousEncodings
#    uses no-op encodings when a function can run on more than one target): f32 prefill ran 0.88-0.90x
#    the single-CPU build (docs/targets.md).
CPU_DISPATCH = ("modules", "variants")


def cpu_variant_conditions(cpus: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """(cpu, features the running CPU must have for its variant) per CPU, best first. Every variant
    but the last is guarded by each IREE-queryable feature it was compiled with; the last is the
    fallback, unguarded (the runtime refuses a CPU that lacks its features before loading)."""
    out = []
    for i, cpu in enumerate(cpus):
        last = i == len(cpus) - 1
        out.append((cpu, () if last else tuple(f for f in llvm_cpu_features(cpu)[1] if f in IREE_X86_QUERY_KEYS)))
    return out


FP8_FLAVOURS = ("none", "e4m3fn", "e4m3fnuz")


@dataclasses.dataclass(frozen=True)
class ArchCaps:
    """What one architecture can do, as IREE 3.13 drives it."""

    fp8: str = "none"  # the E4M3 flavour IREE lowers natively: "none", "e4m3fn" or "e4m3fnuz"
    bf16: bool = False  # native bf16 arithmetic (not just storage)
    f16: bool = True  # native f16 arithmetic
    f64: bool = True  # f64 arithmetic (SPIR-V devices without it need f64 demoted)
    int8_dot: bool = False  # integer dot products (VNNI, DP4a, i8 MFMA/WMMA)
    # 64-bit integer arithmetic. PT2E zero points are int64 tensors, and IREE 3.13's SPIR-V path fails
    # on the i64 vectors of its integer-contraction lowering where the device has none ("failed to
    # legalize operation 'vector.broadcast'" on adreno/valhall4): there int8 programs take the
    # dequantize-then-float form (passes/qdq_float.py).
    int64: bool = True
    # 8-bit storage buffers (SPIR-V StorageBuffer8BitAccess). Without them IREE 3.13 cannot load an
    # int8 tensor at all ("functions in 'spirv.module' can only contain spirv.* ops" on adreno): int8
    # programs are refused for such an arch (compiler/lower.py).
    int8_storage: bool = True
    subgroup_sizes: tuple[int, ...] = ()  # () on CPUs; the module runs only where one of them is available
    shared_memory_kb: int = 0  # workgroup memory; 0 on CPUs
    iree_name: str = ""  # the name IREE's own target table knows; "" = llmc writes the target into the module
    aliases: tuple[str, ...] = ()  # product / code names accepted for --arch
    note: str = ""
    iree_flags: tuple[str, ...] = ()  # what llmc adds for this arch (each a route around an IREE bug, commented where set)

    def __post_init__(self):
        if self.fp8 not in FP8_FLAVOURS:
            raise ValueError(f"fp8 flavour {self.fp8!r} is not one of {FP8_FLAVOURS}")


@dataclasses.dataclass(frozen=True)
class DtypeSupport:
    """Whether llmc compiles a --dtype for a target today, and how."""

    state: str  # "implemented" or "planned"
    how: str  # "native" or "emulated"
    detail: str = ""
    compute: str = ""  # the dtype the program is exported and computed in, when not the --dtype itself

    @property
    def implemented(self) -> bool:
        return self.state == "implemented"

    def text(self) -> str:
        return self.how + (f" ({self.detail})" if self.detail else "")


def _impl(how: str, detail: str = "", compute: str = "") -> DtypeSupport:
    return DtypeSupport("implemented", how, detail, compute)


def _planned(how: str, detail: str = "") -> DtypeSupport:
    return DtypeSupport("planned", how, detail)


# int8 weight-only (passes/int8_weights.py): int8 codes + one f32 scale per output channel, converted
# where used (every backend lowers int8 -> float), math in f16 on GPUs like fp8's. Not int8 arithmetic.
_GPU_INT8 = _impl("emulated", "int8 weights + per-channel f32 scales, converted where used; f16 math", compute="f16")


def _gpu_dtypes(*, bf16: DtypeSupport, fp8: DtypeSupport, int8: DtypeSupport = _GPU_INT8) -> dict[str, DtypeSupport]:
    """A GPU target's dtype rows: f32/f16 native, bf16/fp8/int8 as given."""
    return {"f32": _impl("native"), "f16": _impl("native"), "bf16": bf16, "fp8": fp8, "int8": int8}


@dataclasses.dataclass(frozen=True)
class TargetCaps:
    """What one llmc target is and can do."""

    name: str
    device: str  # IREE HAL device (runtime driver family)
    backend: str  # IREE codegen backend
    default_arch: str
    archs: dict[str, ArchCaps]  # the named archs; cpu takes any LLVM CPU name with the "host" row's caps
    attention: str  # "decompose" (SDPA -> matmul/softmax/matmul before IREE) or "fused" (IREE's attention op)
    data_tiling: bool  # llmc turns IREE's data tiling on (for f32 compute)
    dtypes: dict[str, DtypeSupport]
    runs_here: bool  # can llmc run (and so diff) modules of this target on a machine like CI's
    runs_how: str
    notes: str = ""

    @property
    def implemented(self) -> bool:
        return any(s.implemented for s in self.dtypes.values())

    def dtype_mode(self, dtype: str) -> str:
        s = self.dtypes.get(dtype)
        return s.text() if s else "unsupported"

    def arch_caps(self, arch: str) -> ArchCaps:
        return self.archs.get(arch) or self.archs[self.default_arch]

    def canonical_arch(self, arch: str) -> str | None:
        """The table's name for `arch` (itself, or the arch a product/code name stands for)."""
        if arch in self.archs:
            return arch
        low = arch.lower()
        for name, a in self.archs.items():
            if low == name.lower() or low in a.aliases:
                return name
        return None


_CPU = ArchCaps(
    fp8="none",
    bf16=False,
    f16=False,
    int8_dot=False,
    note="LLVM widens bf16/f16 math to f32 unless the CPU has avx512_bf16 / avx512fp16; VNNI gives int8 dot products",
)
# bf16 weights on cpu, f32 math (passes/bf16_weights.py): without avx512_bf16 LLVM widens every bf16
# operand to f32 and rounds every result back, which made bf16 slower than f32 (a data-tiled bf16
# matmul 1.4 GFLOP/s vs 55 in f32; small Llama prefill 0.39x f32). Stored as bits, a decode step reads
# 2 bytes per weight and prefill runs the f32 data-tiled matmul (docs/targets.md, bf16 on cpu).
_CPU_BF16 = _impl("emulated", "bf16 weights as int16 bits (2 bytes read per weight), f32 math and activations", compute="f32")
_SPIRV_NOTE = "no bf16 arithmetic and no fp8 conversion in IREE's SPIR-V path"
# bf16 weights stored as their 16 bits (int16) and widened with integer ops, everything else f32: SPIR-V
# has no bf16 type, IREE 3.13 fails on any bf16 -> f32 conversion there, and its
# --iree-input-promote-bf16-to-f32 changes the function ABI and the parameters' byte sizes
# (passes/bf16_weights.py).
_SPIRV_BF16 = _impl("emulated", "bf16 weights as int16 bits, f32 math and activations", compute="f32")
_SPIRV_FP8 = _impl("emulated", "E4M3 weights as int8 + per-channel scales, software decode, f16 math", compute="f16")
# As fp8 there: f16 math (the weights converted in f32, times the scale, then cast).
_SPIRV_INT8 = _impl("emulated", "int8 weights + per-channel f32 scales, converted where used; f16 math", compute="f16")

# The Intel profiles IREE 3.13 lacks (it has no Intel Vulkan target and crashes on unknown names).
# Values are the Vulkan limits Mesa's ANV driver reports, as published in the Vulkan hardware
# database (vulkan.gpuinfo.org) for an Arc A770 (DG2, Xe-HPG) and an Arc B580 (BMG, Xe2-HPG); we have
# not run them on hardware: `python -m llmc.runtime.vulkan_probe` on the device prints what it has.
#  - compute types: no fp64 on either chip (shaderFloat64 false); shaderFloat16/Int8/Int16 true;
#    shaderInt64 true (ANV lowers it).
#  - storage: storageBuffer8/16BitAccess true.
#  - dot: VK_KHR_shader_integer_dot_product, 4x8-bit packed accelerated (DP4a).
#  - mma: none usable. VK_KHR_cooperative_matrix exists (8x8x16 on DG2 at subgroup 8, 8x16x16 on Xe2
#    at subgroup 16) but matches none of IREE's SPIR-V intrinsics (16x16x16 WMMA-style).
#  - subgroups: DG2 minSubgroupSize 8, maxSubgroupSize 32; Xe2 16..32 (no SIMD8).
#  - maxComputeSharedMemorySize 65536; maxComputeWorkGroupInvocations 1024; maxComputeWorkGroupSize
#    1024 x 1024 x 1024 (IREE tiles far below that); maxComputeWorkGroupCount 65535 per dimension.
_INTEL_WGP = (
    "compute = fp32|fp16|int64|int32|int16|int8, storage = b32|b16|b8, subgroup = shuffle|arithmetic, "
    "dot = dp4xi8toi32, mma = [], subgroup_size_choices = [{subgroups}], max_workgroup_sizes = [1024, 1024, 1024], "
    "max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 65536, "
    "max_workgroup_counts = [65535, 65535, 65535]"
)
_INTEL_FEATURES = "spirv:v1.6,cap:Shader,cap:PhysicalStorageBufferAddresses,cap:PhysicalStorageBuffer64,cap:Int64"


def _gpu(fp8="none", *, bf16=True, f64=True, int64=True, int8_storage=True, int8_dot=True, subgroups=(64,), shared_kb=64, iree_name="", aliases=(), note="",
         iree_flags=()):
    return ArchCaps(fp8=fp8, bf16=bf16, f64=f64, int64=int64, int8_storage=int8_storage, int8_dot=int8_dot, subgroup_sizes=tuple(subgroups),
                    shared_memory_kb=shared_kb, iree_name=iree_name, aliases=tuple(aliases), note=note, iree_flags=tuple(iree_flags))


# gfx950: IREE 3.13 is killed by SIGFPE (a division by zero in getXorShuffleParamsForTunedChipset,
# reached from LLVMGPUSelectLoweringStrategy's matmul config) on every f16/bf16 matmul with fewer
# than 16 rows and K >= 128: every decode-step linear (M = 1) of a Llama. The xor-shuffle parameters
# belong to gfx950's direct global-load-to-LDS path; with it off the same matmuls compile
# (tests/e2e/test_dtype_matrix.py pins both sides).
_GFX950_FLAGS = ("--iree-llvmgpu-use-direct-load=false",)


TARGETS: dict[str, TargetCaps] = {
    "cpu": TargetCaps(
        name="cpu",
        device="local",
        backend="llvm-cpu",
        default_arch="host",
        archs={"host": _CPU},
        attention="decompose",
        data_tiling=True,
        dtypes={
            "f32": _impl("native"),
            "f16": _impl("native", "f16 storage; LLVM widens arithmetic where the CPU lacks f16 math"),
            "bf16": _CPU_BF16,
            "fp8": _impl("emulated", "E4M3 weights as int8 + per-channel f32 scales, software decode, f32 math", compute="f32"),
            "int8": _impl("emulated", "int8 weights + per-channel f32 scales, packed like fp8, converted where used; f32 math",
                          compute="f32"),
        },
        runs_here=True,
        runs_how="on this CPU (local-task)",
        notes="--arch takes an LLVM CPU name (cascadelake, znver4, x86-64-v3, ...) or 'host'",
    ),
    "hip": TargetCaps(
        name="hip",
        device="hip",
        backend="rocm",
        default_arch="gfx942",
        archs={
            "gfx942": _gpu("e4m3fnuz", iree_name="gfx942", aliases=("mi300x", "mi300a", "mi325x", "cdna3"), note="MI300"),
            "gfx950": _gpu("e4m3fn", shared_kb=160, iree_name="gfx950", aliases=("mi355x", "mi350x", "cdna4"), iree_flags=_GFX950_FLAGS,
                           note="MI355; direct loads to LDS off (IREE 3.13 crashes on small-M f16/bf16 matmuls with them)"),
            "gfx1100": _gpu(subgroups=(32, 64), iree_name="gfx1100", aliases=("rx7900xtx", "rx7900xt", "w7900", "rdna3"), note="RDNA3"),
            "gfx1201": _gpu("e4m3fn", subgroups=(32, 64), iree_name="gfx1201", aliases=("rx9070xt", "rx9070", "r9700", "rdna4"), note="RDNA4"),
        },
        attention="fused",
        data_tiling=False,
        dtypes=_gpu_dtypes(bf16=_impl("native"), fp8=_impl(
            "native", "E4M3 weights + per-channel scales: gfx942 E4M3FNUZ, gfx950/gfx12xx E4M3FN, gfx1100 software decode; f16 math", compute="f16")),
        runs_here=False,
        runs_how="compile only here (needs a ROCm GPU)",
    ),
    "xpu": TargetCaps(
        name="xpu",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="arc",
        archs={
            "arc": _gpu(bf16=False, f64=False, subgroups=(32, 16), aliases=("a770", "a750", "alchemist", "dg2", "xe-hpg"),
                        note="Intel Arc A-series (Xe-HPG); profile written by llmc; " + _SPIRV_NOTE),
            "xe2": _gpu(bf16=False, f64=False, subgroups=(32, 16), aliases=("b580", "b570", "battlemage", "bmg", "lunarlake", "xe2-hpg"),
                        note="Intel Arc B-series / Lunar Lake (Xe2); profile written by llmc; " + _SPIRV_NOTE),
        },
        attention="decompose",  # IREE's SPIR-V backend does not compile its fused attention op
        data_tiling=False,
        dtypes=_gpu_dtypes(bf16=_SPIRV_BF16, fp8=_SPIRV_FP8, int8=_SPIRV_INT8),
        runs_here=False,
        runs_how="compile only here (needs an Intel GPU with a Vulkan driver); the same SPIR-V path runs here as --target=vulkan",
    ),
    "vulkan": TargetCaps(
        name="vulkan",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="llvmpipe",
        # Subgroup sizes and shared memory as IREE 3.13's own table has them
        # (iree-compile --compile-to=executable-targets --iree-vulkan-target=NAME).
        archs={
            "llvmpipe": _gpu(bf16=False, subgroups=(8,), shared_kb=32, iree_name="llvmpipe", aliases=("lavapipe",),
                             note="Mesa's CPU Vulkan driver (lavapipe); " + _SPIRV_NOTE),
            "rdna3": _gpu(bf16=False, subgroups=(32, 64), iree_name="rdna3", aliases=("rx7900xtx", "gfx1100")),
            "rdna4": _gpu(bf16=False, subgroups=(32, 64), iree_name="rdna4", aliases=("rx9070xt", "gfx1201")),
            "ampere": _gpu(bf16=False, subgroups=(32,), shared_kb=163, iree_name="ampere", aliases=("sm_80", "sm_86", "rtx3090"),
                           note="on an NVIDIA driver f32 attention (P.V matmul fused with a transpose) returned NaN; check with llmc diff"),
            "ada": _gpu(bf16=False, subgroups=(32,), shared_kb=99, iree_name="ada", aliases=("sm_89", "rtx4090", "l4"),
                        note="as ampere"),
            "pascal": _gpu(bf16=False, int8_dot=False, subgroups=(32,), shared_kb=48, iree_name="pascal", aliases=("sm_60", "sm_61"),
                           note="the one NVIDIA-type target whose f16 ran right on an H100's Vulkan driver"),
            "valhall4": _gpu(bf16=False, f64=False, int64=False, subgroups=(16,), shared_kb=32, iree_name="valhall4", aliases=("mali-g715",), note="Arm Mali"),
            "adreno": _gpu(bf16=False, f64=False, int64=False, int8_storage=False, subgroups=(64,), shared_kb=32, iree_name="adreno", note="Qualcomm"),
        },
        attention="decompose",  # IREE's SPIR-V backend does not compile its fused attention op
        data_tiling=False,
        dtypes=_gpu_dtypes(bf16=_SPIRV_BF16, fp8=_SPIRV_FP8, int8=_SPIRV_INT8),
        runs_here=True,
        runs_how="on Mesa lavapipe (apt-get install mesa-vulkan-drivers libvulkan1) or any Vulkan GPU",
    ),
    "cuda": TargetCaps(
        name="cuda",
        device="cuda",
        backend="cuda",
        default_arch="sm_90",
        archs={
            "sm_80": _gpu(subgroups=(32,), shared_kb=163, iree_name="sm_80", aliases=("a100", "ampere"), note="A100"),
            "sm_86": _gpu(subgroups=(32,), shared_kb=99, iree_name="sm_86", aliases=("a10", "a40", "rtx3090")),
            # sm_89/sm_90 have E4M3FN in hardware, but IREE 3.13 fails to lower it ("LLVM Translation failed for
            # operation: builtin.unrealized_conversion_cast"): fp8 is decoded in software there.
            "sm_89": _gpu(subgroups=(32,), shared_kb=99, iree_name="sm_89", aliases=("l4", "l40s", "rtx4090", "ada"), note="L4/RTX 40"),
            "sm_90": _gpu(subgroups=(32,), shared_kb=99, aliases=("h100", "h200", "gh200", "hopper"),
                          note="H100; IREE 3.13 lacks it: sm_89's capabilities under arch sm_90, written into the module"),
        },
        attention="fused",
        data_tiling=False,
        dtypes=_gpu_dtypes(bf16=_impl("native"), fp8=_impl(
            "emulated", "E4M3 weights as int8 + per-channel scales, software decode (IREE 3.13 fails in LLVM translation of native fp8); f16 math",
            compute="f16")),
        runs_here=False,
        runs_how="compile only here (needs an NVIDIA GPU; the iree-base-runtime wheel has the CUDA driver)",
    ),
}


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    """A target with its arch and dtype fixed and checked: everything the passes and iree-compile need.

    Made once per compile by `resolve`. The flags depend on one fact known only after export (whether
    any shape is dynamic): `for_shapes(dynamic)` gives the copy with that settled, no re-validation.
    """

    caps: TargetCaps
    arch: str  # the table's name ("host" or an LLVM CPU name on cpu)
    dtype: str
    dynamic: bool = False
    extra_flags: tuple[str, ...] = ()  # the user's --iree-flag values, after llmc's own (later flags win)
    pass_options: tuple[tuple[str, object], ...] = ()  # what passes read from ctx.options (fp8_exclude, ...)
    # Several CPUs: "modules" (one .vmfb per CPU, sharing the .irpa; llmc.load picks one) or "variants"
    # (one .vmfb with an executable variant per CPU; IREE picks at load). See compiler/cpu_variants.py.
    cpu_dispatch: str = "modules"
    # --tensor-parallel N: the module runs on N devices of this kind, IREE's @__device_0..N-1 (declared
    # by N --iree-hal-target-device=KIND[i] flags; docs/tensor-parallel.md)
    devices: int = 1

    @property
    def name(self) -> str:
        return self.caps.name

    @property
    def arch_caps(self) -> ArchCaps:
        return self.caps.arch_caps(self.arch)

    @property
    def compute_dtype(self) -> str:
        """The dtype the program is exported in: --dtype itself, or f32 where it is emulated that way."""
        return self.caps.dtypes[self.dtype].compute or self.dtype

    @property
    def iree_flags(self) -> tuple[str, ...]:
        """iree-compile's flags; with one module per CPU, those of the main module (the last CPU's)."""
        if self.cpu_modules:
            return self.for_cpu(self.cpus[-1]).iree_flags
        flags = _flags(self.caps, self.arch, self.dtype, self.compute_dtype, self.dynamic)
        return (*_on_devices(flags, self.devices), *self.extra_flags)

    @property
    def cpu_modules(self) -> bool:
        """Several CPUs, each compiled into its own module (cpu_dispatch "modules")."""
        return self.cpu_dispatch == "modules" and len(self.cpus) > 1

    def for_cpu(self, cpu: str) -> "ResolvedTarget":
        """The same target for one of its CPUs alone (the flags of that CPU's module)."""
        return dataclasses.replace(self, arch=cpu, cpu_dispatch="modules")

    @property
    def cpus(self) -> tuple[str, ...]:
        """llvm-cpu: the CPUs the module carries code for, best first (one unless --arch lists several)."""
        return cpu_variants(self.arch) if self.caps.backend == "llvm-cpu" else ()

    @property
    def module_target(self) -> str | None:
        """The `hal.device.targets` attribute llmc writes into the module for an arch IREE's table
        lacks (Intel, sm_90) or for several CPUs; None where the flags name the target."""
        if self.caps.backend == "llvm-cpu":
            return _cpu_module_target(self.cpus) if len(self.cpus) > 1 and not self.cpu_modules else None
        return _module_target(self.caps.name, self.arch) if not self.arch_caps.iree_name else None

    def for_shapes(self, dynamic: bool) -> "ResolvedTarget":
        return dataclasses.replace(self, dynamic=dynamic)


def resolve(
    target: str,
    arch: str | None,
    dtype: str,
    *,
    dynamic: bool = False,
    extra_flags: tuple[str, ...] = (),
    allow_planned: bool = False,
    cpu_dispatch: str = "modules",
    devices: int = 1,
) -> ResolvedTarget:
    """Validate target/arch/dtype (and extra IREE flags). Raises UnsupportedTargetError.

    allow_planned: accept a target or dtype that is not implemented yet, for running passes only
    (llmc-opt): the result has capabilities but no iree-compile flags.
    """
    caps = TARGETS.get(target)
    if caps is None:
        raise UnsupportedTargetError(
            f"--target={target!r} is not a known target; choose one of: {', '.join(TARGETS)} "
            "(`llmc targets` lists them)"
        )
    if dtype not in DTYPES:
        raise UnsupportedTargetError(f"--dtype={dtype!r} is not a known dtype; choose one of: {', '.join(DTYPES)}")
    if not caps.implemented and not allow_planned:
        raise UnsupportedTargetError(
            f"--target={target} is planned but not implemented in this llmc version; use --target=cpu"
        )
    support = caps.dtypes[dtype]
    if not support.implemented and not allow_planned:
        done = " or ".join(d for d, s in caps.dtypes.items() if s.implemented)
        raise UnsupportedTargetError(
            f"--dtype={dtype} on --target={target} is planned ({support.text()}), not implemented yet; use --dtype={done}"
        )
    arch = arch or caps.default_arch
    if caps.backend != "llvm-cpu":
        named = caps.canonical_arch(arch)
        if named is None:
            known = ", ".join(f"{n} ({'/'.join(a.aliases)})" if a.aliases else n for n, a in caps.archs.items())
            raise UnsupportedTargetError(f"--arch={arch!r} is not an arch of --target={target}; known: {known}")
        arch = named
    else:
        cpus = cpu_variants(arch)
        for cpu in cpus:
            if cpu == "host" and len(cpus) == 1:
                continue
            if cpu not in X86_CPUS:
                raise UnsupportedTargetError(
                    f"--arch={arch!r}: {cpu!r} is not a CPU that IREE's LLVM knows for x86-64; use --arch=host, an "
                    "LLVM CPU name such as cascadelake, icelake-server, znver4, x86-64-v3, several of them "
                    f"best first (x86-64-v4,x86-64-v3) or a preset ({', '.join(CPU_PRESETS)})"
                )
        if len(set(cpus)) != len(cpus):
            raise UnsupportedTargetError(f"--arch={arch!r} names a CPU twice; list each CPU once, best first")
    if cpu_dispatch not in CPU_DISPATCH:
        raise UnsupportedTargetError(f"--cpu-dispatch={cpu_dispatch!r}: choose one of {', '.join(CPU_DISPATCH)}")
    bad = [f for f in extra_flags if not f.startswith("--")]
    if bad:
        raise UnsupportedTargetError(
            f"--iree-flag {bad[0]!r}: IREE flags start with '--', e.g. --iree-flag=--iree-opt-level=O3"
        )
    if dtype in ("int8", "fp8") and not caps.arch_caps(arch).int8_storage:
        raise UnsupportedTargetError(
            f"--dtype={dtype} --target={target} --arch={arch}: the device has no 8-bit storage buffers, and IREE cannot "
            f"load 8-bit weights there; use --dtype=f16 or f32 for it"
        )
    r = ResolvedTarget(caps, arch, dtype, dynamic, tuple(extra_flags), cpu_dispatch=cpu_dispatch, devices=devices)
    if devices > 1 and (r.module_target or len(r.cpus) > 1):
        # IREE 3.13 resolves `#hal.device.promise<@__device_i>` only against devices its flags declare;
        # with the devices written into the module (hal.device.targets) iree-compile crashes in
        # DeviceAnalysis::gatherDeviceTargets (SIGSEGV, GlobalOpInterface::getGlobalInitialValue).
        what = f"--arch={arch} (several CPUs)" if len(r.cpus) > 1 else f"--target={target} --arch={arch}"
        raise UnsupportedTargetError(
            f"--tensor-parallel={devices} with {what}: IREE 3.13 takes several devices only for an arch its own flags "
            f"name, and this one is written into the module; use one CPU (--arch host or a CPU name) on cpu, "
            f"an arch such as sm_89 or sm_80 on cuda, or hip"
        )
    return r


# fp8 weights (and bf16 ones stored as bits) stay narrow in device memory. IREE hoists any
# computation on constants (parameters included) into load-time initializers when the result grows
# by at most 1 MiB (its --iree-opt-const-expr-max-size-increase-threshold default): every fp8 weight
# below ~256K elements would be decoded once at load and kept widened, and the call would run a plain
# f32/f16 matmul on it. With the threshold at 0 the decode stays in the dispatch that uses the weight.
_NARROW_FLAGS = ["--iree-opt-const-expr-max-size-increase-threshold=0"]


# Narrow weights on cpu do not turn on --iree-dispatch-creation-enable-aggressive-fusion (they did
# until 2026-11-26): the decode's weight decode fuses into its one-row reductions without it, an A/B
# measured no gain from it, and with it IREE 3.13 fails on static-length prefills (docs/targets.md,
# "bf16 on cpu").


_DEVICE_FLAG = "--iree-hal-target-device="


def _on_devices(flags: list[str], n: int) -> list[str]:
    """The flags for n devices of the one device kind they name: `--iree-hal-target-device=KIND[i]` for
    i < n, which IREE declares as @__device_0..n-1 (what `#hal.device.promise<@__device_i>` in the
    program refers to). One device: the flags as they are."""
    if n == 1:
        return list(flags)
    out = []
    for f in flags:
        out += [f"{f}[{i}]" for i in range(n)] if f.startswith(_DEVICE_FLAG) else [f]
    return out


def _flags(caps: TargetCaps, arch: str, dtype: str, compute: str, dynamic: bool) -> list[str]:
    narrow = dtype in ("fp8", "int8") or (dtype == "bf16" and compute == "f32")  # weights stored narrower than computed
    extra = _NARROW_FLAGS if narrow else []
    return _target_flags(caps, arch, dtype, compute, dynamic) + extra


def _target_flags(caps: TargetCaps, arch: str, dtype: str, compute: str, dynamic: bool) -> list[str]:
    if caps.backend == "llvm-cpu":
        return _cpu_flags(caps, arch, dtype, compute, dynamic)
    a = caps.arch_caps(arch)
    flags = []
    if a.iree_name:  # otherwise the module carries its target (ResolvedTarget.module_target)
        option = {"rocm": "--iree-rocm-target", "cuda": "--iree-cuda-target", "vulkan-spirv": "--iree-vulkan-target"}[caps.backend]
        flags += [f"--iree-hal-target-device={caps.device}", f"{option}={a.iree_name}"]
    if a.f64:
        flags.append("--iree-input-demote-f64-to-f32=false")  # f64 is kept, as on cpu
    return flags + list(a.iree_flags)


def _cpu_flags(caps: TargetCaps, arch: str, dtype: str, compute: str, dynamic: bool) -> list[str]:
    # Several CPUs: the module carries its device target (ResolvedTarget.module_target), one
    # executable target per CPU, and iree-compile is given none.
    multi = len(cpu_variants(arch)) > 1
    flags = [] if multi else [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        f"--iree-llvmcpu-target-cpu={arch}",
    ]
    # f64 is kept, never silently demoted to f32 (README.md: call semantics).
    flags.append("--iree-input-demote-f64-to-f32=false")
    # fp8 weights too: on cpu every fp8 weight a matmul reads is stored packed and decoded whole into
    # its own [N, K] tensor for multi-row products (passes/fp8_weights.py), which IREE then packs per
    # call; an fp8 decode fused into a data-tiled matmul itself put a whole K panel of f32 on the
    # stack ("exceeded stack allocation limit of 32768 bytes" already at K = 1024).
    if caps.data_tiling and compute == "f32":
        # Data tiling is the largest single CPU gain for f32 (off by default in 3.13). The
        # default route (--iree-opt-data-tiling) crashes on batch matmuls with two dynamic dims
        # (attention scores with a dynamic sequence): "'affine.delinearize_index' op no basis
        # element may be statically non-positive". The older global-opt route
        # (pack/mmt4d/unpack, measured within 10% of it) compiles those.
        # Not for bf16/f16 compute: on a CPU without avx512_bf16 a data-tiled bf16 matmul ran
        # at 1.4 GFLOP/s vs 55 in f32 (125M Llama prefill 7.0 s with data tiling, 0.106 s
        # without; tools/bench_compile_size.py --dtype bf16).
        # Several CPUs take the global-opt route too: the default one packs each weight once, in the
        # first CPU's tile layout, and every other CPU's matmul then repacks it inside its dispatch
        # ("One or more operations with large vector sizes (16384 bytes) were found", x86-64-v4 +
        # x86-64-v3); the global-opt route compiles and runs both.
        flags.append("--iree-global-opt-data-tiling=true" if dynamic or multi else "--iree-opt-data-tiling=true")
    if dtype in ("bf16", "f16", "fp8", "int8"):
        # Weights stored narrower than they are computed: without this IREE writes a widened copy of
        # every weight on every call instead of fusing the conversion (fp8's decode) into the matmul.
        flags.append("--iree-dispatch-creation-block-matmul-producer-fusion=false")
    # Convolutions as im2col + matmul (the matmul then data-tiled): IREE 3.13's direct CPU
    # convolution ran a PT2E int8 conv net 13x slower (620 ms vs 48 ms per batch of 32, 1 thread) and
    # its f32 model 1.5x slower (60 vs 40 ms) (tools/bench_int8.py, docs/int8.md).
    flags.append("--iree-global-opt-use-im2col-for-convs")
    return flags


# ---------------------------------------------------------------------------------------------
# Targets written into the module


def _module_target(target: str, arch: str) -> str:
    """The `hal.device.targets` attribute (MLIR text) for an arch IREE 3.13's table lacks."""
    if target == "xpu":
        subgroups = ", ".join(map(str, TARGETS["xpu"].archs[arch].subgroup_sizes))
        wgp = _INTEL_WGP.format(subgroups=subgroups)
        info = f'#iree_gpu.target<arch = "intel-{arch}", features = "{_INTEL_FEATURES}", wgp = <{wgp}>>'
        return (
            '[#hal.device.target<"vulkan", [#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb", '
            f"{{iree_codegen.target_info = {info}}}>]> : !hal.device]"
        )
    if target == "cuda" and arch == "sm_90":
        # sm_89's capability set (asked of this iree-compile, so it matches its attribute syntax) under
        # the sm_90 name: LLVM's NVPTX backend then emits sm_90 code. Measured on an H100: the same
        # results and speed as sm_89 PTX.
        device = _iree_device_target(("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89"))
        return "[" + device.replace('arch = "sm_89"', 'arch = "sm_90"') + " : !hal.device]"
    raise UnsupportedTargetError(f"--target={target} --arch={arch}: no module target defined")  # pragma: no cover


def _cpu_module_target(cpus: tuple[str, ...]) -> str:
    """One local device with an llvm-cpu executable target per CPU, in order (best first): the
    targets iree-compile builds for each CPU alone, side by side."""
    execs = []
    for cpu in cpus:
        device = _iree_device_target(("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
                                      f"--iree-llvmcpu-target-cpu={cpu}"))
        m = re.fullmatch(r'#hal\.device\.target<"local", \[(#hal\.executable\.target<.*>)\]>', device)
        if not m:
            raise UnsupportedTargetError(f"--arch={cpu}: iree-compile reported an unexpected device target: {device[:200]}")
        execs.append(m.group(1))
    return '[#hal.device.target<"local", [' + ", ".join(execs) + "]> : !hal.device]"


@functools.lru_cache(maxsize=None)
def _iree_device_target(flags: tuple[str, ...]) -> str:
    """The `#hal.device.target<...>` iree-compile itself builds for `flags` (MLIR text)."""
    out = _ask_iree(("--compile-to=executable-targets", *flags))
    m = re.search(r"util\.global private @__device_0 = (#hal\.device\.target<.*>) : !hal\.device", out)
    if not m:
        raise UnsupportedTargetError(f"iree-compile did not report a device target for {' '.join(flags)}")
    return m.group(1)


def as_json() -> dict:
    """The table as `llmc targets --json` prints it."""
    out = {}
    for name, c in TARGETS.items():
        d = dataclasses.asdict(c)
        d["implemented"] = c.implemented
        out[name] = d
    return out


_TRIVIAL_MODULE = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"


def _ask_iree(flags: tuple[str, ...]) -> str:
    """iree-compile's stdout for a trivial module under `flags` ("" if it failed)."""
    from iree.compiler.tools.binaries import find_tool

    with tempfile.TemporaryDirectory(prefix="llmc-target-") as d:
        src = os.path.join(d, "t.mlir")
        with open(src, "w") as f:
            f.write(_TRIVIAL_MODULE)
        proc = subprocess.run([find_tool("iree-compile"), src, *flags], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


@functools.lru_cache(maxsize=None)
def llvm_cpu_features(arch: str) -> tuple[str, tuple[str, ...]]:
    """(resolved CPU name, enabled features) that IREE compiles for `arch` ("host" included).

    Asked of iree-compile itself (the executable configuration names both), so every CPU name LLVM
    knows is covered without a table of our own. ("", ()) if iree-compile can't tell.
    """
    out = _ask_iree((
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        f"--iree-llvmcpu-target-cpu={arch}",
        "--compile-to=executable-configurations",
    ))
    if not out:
        return "", ()

    def attr(key: str) -> str:
        start = out.find(f'{key} = "')
        if start < 0:
            return ""
        text = out[start + len(key) + 4 :]
        return text[: text.find('"')]

    features = {f[1:] for f in attr("cpu_features").split(",") if f.startswith("+")}
    return attr("cpu"), tuple(sorted(features))


def check_static_decode(spec) -> str:
    """--static-decode: "auto", "on" or "off"."""
    if spec not in ("auto", "on", "off"):
        raise UsageError(f"--static-decode={spec!r}: choose auto, on or off")
    return spec


def parse_buckets(spec):
    """--prefill-buckets: "auto", "none", token counts "128,512", or sizes from the Python API (128, 512)
    -> "auto" or a sorted tuple of distinct sizes, each at least 2."""
    if isinstance(spec, str):
        t = spec.strip().lower()
        if t in ("auto", "none", ""):
            return "auto" if t == "auto" else ()
        items = [x for x in t.split(",") if x.strip()]
    else:
        items = list(spec)
    try:
        sizes = tuple(sorted({int(x) for x in items}))
    except (TypeError, ValueError):
        raise UsageError(f"--prefill-buckets={spec}: give auto, none, or prompt sizes such as 128,512") from None
    if not sizes or sizes[0] < 2:
        raise UsageError(f"--prefill-buckets={spec}: each size must be at least 2 tokens")
    return sizes


KV_DTYPES = ("f32", "bf16")  # what --kv-dtype names besides auto


def parse_kv_dtype(spec) -> str:
    """--kv-dtype: "auto" (compiler/llm.py resolve_kv_dtype decides per target and dtype) or one of KV_DTYPES."""
    t = str(spec).strip().lower() if spec is not None else "auto"
    if t not in ("auto", *KV_DTYPES):
        raise UsageError(f"--kv-dtype={spec}: give auto, {', '.join(KV_DTYPES)}")
    return t


def parse_chunk(spec):
    """--prefill-chunk: "auto", "none" (or 0), or a token count -> "auto" or an int (0 = none)."""
    if isinstance(spec, str):
        t = spec.strip().lower()
        if t in ("auto", "none", ""):
            return "auto" if t == "auto" else 0
    try:
        n = -1 if isinstance(spec, bool) else int(spec) if spec is not None else 0
    except (TypeError, ValueError):
        n = -1
    if n != 0 and n < 2:
        raise UsageError(f"--prefill-chunk={spec}: give auto, none, or a chunk size of at least 2 tokens such as 64")
    return n
