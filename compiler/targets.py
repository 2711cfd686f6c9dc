"""The target table: every user-facing target name, what it can do (typed), and the IREE flags it needs.

This is the only place that maps llmc's target names (`cpu`, `hip`, `xpu`, ...) to IREE devices,
backends, flags and capabilities (docs/targets.md). The capabilities are typed fields, read by the pass
pipeline (compiler/pipeline.py: which passes run), by `llmc targets` and by the manifest; nothing
tests prose by prefix. Facts come from measurements with IREE 3.13 (docs/targets.md):

- llvm-cpu: always name the CPU (`--iree-llvmcpu-target-cpu`; without it code is 38x slower) and
  turn data tiling on for f32 (off by default in 3.13; the largest single gain). Low-precision
  weights need `--iree-dispatch-creation-block-matmul-producer-fusion=false`, or every call writes an
  f32 copy of every weight. Attention is decomposed before IREE: its fused CPU attention op runs ~9x
  slower (the `cpu-attention` pass).
- hip: gfx942 (MI300) accepts only E4M3FNUZ fp8, gfx950/gfx12xx only E4M3FN; RDNA3 has no fp8.
- SPIR-V (xpu, vulkan): no bf16 arithmetic, no fp8 conversion; a module built for another subgroup
  size runs silently wrong.
- An unknown target or arch is rejected here, before IREE sees it (IREE segfaults on some).

Only `cpu` is implemented end to end so far; the GPU rows carry their measured capabilities so that
`llmc targets` tells the truth about them and the compile driver refuses them with a clear message.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import tempfile

from llmc.dtypes import COMPUTE_DTYPES
from llmc.errors import UnsupportedTargetError

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


FP8_FLAVOURS = ("none", "e4m3fn", "e4m3fnuz")


@dataclasses.dataclass(frozen=True)
class ArchCaps:
    """What one architecture can do, as IREE 3.13 drives it."""

    fp8: str = "none"  # the E4M3 flavour IREE lowers natively: "none", "e4m3fn" or "e4m3fnuz"
    bf16: bool = False  # native bf16 arithmetic (not just storage)
    f16: bool = True  # native f16 arithmetic
    int8_dot: bool = False  # integer dot products (VNNI, DP4a, i8 MFMA/WMMA)
    subgroup_sizes: tuple[int, ...] = ()  # () on CPUs
    shared_memory_kb: int = 0  # workgroup memory; 0 on CPUs
    note: str = ""

    def __post_init__(self):
        if self.fp8 not in FP8_FLAVOURS:
            raise ValueError(f"fp8 flavour {self.fp8!r} is not one of {FP8_FLAVOURS}")


@dataclasses.dataclass(frozen=True)
class DtypeSupport:
    """Whether llmc compiles a --dtype for a target today, and how."""

    state: str  # "implemented" or "planned"
    how: str  # "native" or "emulated"
    detail: str = ""

    @property
    def implemented(self) -> bool:
        return self.state == "implemented"

    def text(self) -> str:
        return self.how + (f" ({self.detail})" if self.detail else "")


def _impl(how: str, detail: str = "") -> DtypeSupport:
    return DtypeSupport("implemented", how, detail)


def _planned(how: str, detail: str = "") -> DtypeSupport:
    return DtypeSupport("planned", how, detail)


def _planned_gpu(*, bf16: DtypeSupport, fp8: DtypeSupport) -> dict[str, DtypeSupport]:
    """A GPU target's dtype rows before it is implemented: f32/f16 native, bf16/fp8 as given."""
    return {"f32": _planned("native"), "f16": _planned("native"), "bf16": bf16, "fp8": fp8}


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


_CPU = ArchCaps(
    fp8="none",
    bf16=False,
    f16=False,
    int8_dot=False,
    note="LLVM widens bf16/f16 math to f32 unless the CPU has avx512_bf16 / avx512fp16; VNNI gives int8 dot products",
)
_SPIRV_NOTE = "no bf16 arithmetic and no fp8 conversion in IREE's SPIR-V path"

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
            "bf16": _impl("native", "bf16 storage; widened to f32 for arithmetic without avx512_bf16"),
            "fp8": _planned("emulated", "int8 storage + software decode"),
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
            "gfx942": ArchCaps(fp8="e4m3fnuz", bf16=True, int8_dot=True, subgroup_sizes=(64,), shared_memory_kb=64, note="MI300"),
            "gfx950": ArchCaps(fp8="e4m3fn", bf16=True, int8_dot=True, subgroup_sizes=(64,), shared_memory_kb=160,
                               note="MI355; iree-compile crashes (exit 248) on f16/bf16 decoder layers"),
            "gfx1100": ArchCaps(fp8="none", bf16=True, int8_dot=True, subgroup_sizes=(32, 64), shared_memory_kb=64, note="RDNA3"),
            "gfx1201": ArchCaps(fp8="e4m3fn", bf16=True, int8_dot=True, subgroup_sizes=(32, 64), shared_memory_kb=64, note="RDNA4"),
        },
        attention="fused",
        data_tiling=False,
        dtypes=_planned_gpu(bf16=_planned("native"), fp8=_planned("native", "gfx942: E4M3FNUZ; gfx950/gfx12xx: E4M3FN; others emulated")),
        runs_here=False,
        runs_how="compile only",
    ),
    "xpu": TargetCaps(
        name="xpu",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="arc",
        archs={"arc": ArchCaps(fp8="none", bf16=False, int8_dot=True, subgroup_sizes=(8, 16, 32), shared_memory_kb=64,
                               note="Intel Arc A770-class; " + _SPIRV_NOTE)},
        attention="fused",
        data_tiling=False,
        dtypes=_planned_gpu(bf16=_planned("emulated", "bf16 storage, f16/f32 math"), fp8=_planned("emulated", "integer storage, f32 math")),
        runs_here=False,
        runs_how="compile only",
    ),
    "vulkan": TargetCaps(
        name="vulkan",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="llvmpipe",
        archs={"llvmpipe": ArchCaps(fp8="none", bf16=False, int8_dot=True, subgroup_sizes=(8,), shared_memory_kb=32,
                                    note="Mesa lavapipe; " + _SPIRV_NOTE)},
        attention="fused",
        data_tiling=False,
        dtypes=_planned_gpu(bf16=_planned("emulated", "as xpu"), fp8=_planned("emulated", "as xpu")),
        runs_here=True,
        runs_how="on Mesa lavapipe (apt-get install mesa-vulkan-drivers libvulkan1), once implemented",
    ),
    "cuda": TargetCaps(
        name="cuda",
        device="cuda",
        backend="cuda",
        default_arch="sm_90",
        archs={
            "sm_80": ArchCaps(fp8="none", bf16=True, int8_dot=True, subgroup_sizes=(32,), shared_memory_kb=164, note="A100"),
            "sm_86": ArchCaps(fp8="none", bf16=True, int8_dot=True, subgroup_sizes=(32,), shared_memory_kb=100),
            "sm_89": ArchCaps(fp8="e4m3fn", bf16=True, int8_dot=True, subgroup_sizes=(32,), shared_memory_kb=100, note="L4/RTX 40"),
            "sm_90": ArchCaps(fp8="e4m3fn", bf16=True, int8_dot=True, subgroup_sizes=(32,), shared_memory_kb=228, note="H100"),
        },
        attention="fused",
        data_tiling=False,
        dtypes=_planned_gpu(bf16=_planned("native"), fp8=_planned("emulated", "IREE 3.13 fails in LLVM translation of native fp8")),
        runs_here=False,
        runs_how="on a lent NVIDIA GPU machine only",
    ),
}


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    """A target with its arch and dtype fixed and checked: everything the passes and iree-compile need.

    Made once per compile by `resolve`. The flags depend on one fact known only after export (whether
    any shape is dynamic): `for_shapes(dynamic)` gives the copy with that settled, no re-validation.
    """

    caps: TargetCaps
    arch: str  # as the user named it ("host" included)
    dtype: str
    dynamic: bool = False
    extra_flags: tuple[str, ...] = ()  # the user's --iree-flag values, after llmc's own (later flags win)

    @property
    def name(self) -> str:
        return self.caps.name

    @property
    def arch_caps(self) -> ArchCaps:
        return self.caps.arch_caps(self.arch)

    @property
    def iree_flags(self) -> tuple[str, ...]:
        return (*_flags(self.caps, self.arch, self.dtype, self.dynamic), *self.extra_flags)

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
    if caps.backend != "llvm-cpu" and arch not in caps.archs:
        raise UnsupportedTargetError(f"--arch={arch!r} is not an arch of --target={target}; known: {', '.join(caps.archs)}")
    if caps.backend == "llvm-cpu" and arch != "host" and arch not in X86_CPUS:
        raise UnsupportedTargetError(
            f"--arch={arch!r} is not a CPU that IREE's LLVM knows for x86-64; use --arch=host or an "
            "LLVM CPU name such as cascadelake, icelake-server, znver4, x86-64-v3"
        )
    bad = [f for f in extra_flags if not f.startswith("--")]
    if bad:
        raise UnsupportedTargetError(
            f"--iree-flag {bad[0]!r}: IREE flags start with '--', e.g. --iree-flag=--iree-opt-level=O3"
        )
    return ResolvedTarget(caps, arch, dtype, dynamic, tuple(extra_flags))


def _flags(caps: TargetCaps, arch: str, dtype: str, dynamic: bool) -> list[str]:
    if caps.backend != "llvm-cpu":  # pragma: no cover - resolve() refuses unimplemented targets
        raise UnsupportedTargetError(f"--target={caps.name}: no flag set defined")
    flags = [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        f"--iree-llvmcpu-target-cpu={arch}",
        # f64 is kept, never silently demoted to f32 (README.md: call semantics).
        "--iree-input-demote-f64-to-f32=false",
    ]
    if caps.data_tiling and dtype == "f32":
        # Data tiling is the largest single CPU gain for f32 (off by default in 3.13). The
        # default route (--iree-opt-data-tiling) crashes on batch matmuls with two dynamic dims
        # (attention scores with a dynamic sequence): "'affine.delinearize_index' op no basis
        # element may be statically non-positive". The older global-opt route
        # (pack/mmt4d/unpack, measured within 10% of it) compiles those.
        # Not for bf16/f16 compute: on a CPU without avx512_bf16 a data-tiled bf16 matmul ran
        # at 1.4 GFLOP/s vs 55 in f32 (125M Llama prefill 7.0 s with data tiling, 0.106 s
        # without; tools/bench_compile_size.py --dtype bf16).
        flags.append("--iree-global-opt-data-tiling=true" if dynamic else "--iree-opt-data-tiling=true")
    if dtype in ("bf16", "f16", "fp8"):
        flags.append("--iree-dispatch-creation-block-matmul-producer-fusion=false")
    return flags


def as_json() -> dict:
    """The table as `llmc targets --json` prints it."""
    out = {}
    for name, c in TARGETS.items():
        d = dataclasses.asdict(c)
        d["implemented"] = c.implemented
        out[name] = d
    return out


_TRIVIAL_MODULE = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"


@functools.lru_cache(maxsize=None)
def llvm_cpu_features(arch: str) -> tuple[str, tuple[str, ...]]:
    """(resolved CPU name, enabled features) that IREE compiles for `arch` ("host" included).

    Asked of iree-compile itself (the executable configuration names both), so every CPU name LLVM
    knows is covered without a table of our own. ("", ()) if iree-compile can't tell.
    """
    from iree.compiler.tools.binaries import find_tool

    with tempfile.TemporaryDirectory(prefix="llmc-cpu-") as d:
        src = os.path.join(d, "t.mlir")
        with open(src, "w") as f:
            f.write(_TRIVIAL_MODULE)
        proc = subprocess.run(
            [
                find_tool("iree-compile"),
                src,
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                f"--iree-llvmcpu-target-cpu={arch}",
                "--compile-to=executable-configurations",
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        return "", ()

    def attr(key: str) -> str:
        start = proc.stdout.find(f'{key} = "')
        if start < 0:
            return ""
        text = proc.stdout[start + len(key) + 4 :]
        return text[: text.find('"')]

    features = {f[1:] for f in attr("cpu_features").split(",") if f.startswith("+")}
    return attr("cpu"), tuple(sorted(features))
