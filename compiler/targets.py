"""The target table: every user-facing target name, what it can do, and the IREE flags it needs.

This is the only place that maps llmc's target names (`cpu`, `hip`, `xpu`, ...) to IREE devices,
backends and flags (DESIGN.md). Facts come from `shared/research/` (IREE 3.13 measurements):

- llvm-cpu: always name the CPU (`--iree-llvmcpu-target-cpu`; without it code is 38x slower) and
  turn data tiling on (off by default in 3.13; the largest single gain). Low-precision weights need
  `--iree-dispatch-creation-block-matmul-producer-fusion=false`, or every call writes an f32 copy
  of every weight. Attention is decomposed before IREE: its fused CPU attention op runs ~9x slower.
- An unknown target or arch is rejected here, before IREE sees it (IREE segfaults on some).

Only `cpu` is implemented end to end so far; the GPU rows are listed so that `llmc targets` tells
the truth about them ("planned") and the compile driver refuses them with a clear message.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import tempfile

from llmc.errors import UnsupportedTargetError

DTYPES = ("f32", "f16", "bf16", "fp8")

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


@dataclasses.dataclass(frozen=True)
class TargetCaps:
    """What one llmc target is and can do."""

    name: str
    device: str  # IREE HAL device (runtime driver family)
    backend: str  # IREE codegen backend
    default_arch: str
    dtype_support: dict  # dtype -> "native" | "emulated: how" | "planned"
    attention: str  # "decompose" (SDPA -> matmul/softmax/matmul before IREE) or "fused"
    runs_here: str
    implemented: bool
    notes: str = ""

    def dtype_mode(self, dtype: str) -> str:
        return self.dtype_support.get(dtype, "unsupported")


TARGETS: dict[str, TargetCaps] = {
    "cpu": TargetCaps(
        name="cpu",
        device="local",
        backend="llvm-cpu",
        default_arch="host",
        dtype_support={
            "f32": "native",
            "f16": "native (f16 storage; LLVM widens arithmetic where the CPU lacks f16 math)",
            "bf16": "native (bf16 storage; widened to f32 for arithmetic without avx512_bf16)",
            "fp8": "planned (emulated: int8 storage + software decode)",
        },
        attention="decompose",
        runs_here="yes",
        implemented=True,
        notes="--arch takes an LLVM CPU name (cascadelake, znver4, x86-64-v3, ...) or 'host'",
    ),
    "hip": TargetCaps(
        name="hip",
        device="hip",
        backend="rocm",
        default_arch="gfx942",
        dtype_support={
            "f32": "planned",
            "f16": "planned",
            "bf16": "planned",
            "fp8": "planned (gfx942: E4M3FNUZ; gfx950/gfx12xx: E4M3FN; others emulated)",
        },
        attention="fused",
        runs_here="compile only",
        implemented=False,
    ),
    "xpu": TargetCaps(
        name="xpu",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="arc",
        dtype_support={
            "f32": "planned",
            "f16": "planned",
            "bf16": "planned (emulated: bf16 storage, f16/f32 math)",
            "fp8": "planned (emulated: integer storage, f32 math)",
        },
        attention="fused",
        runs_here="compile only",
        implemented=False,
    ),
    "vulkan": TargetCaps(
        name="vulkan",
        device="vulkan",
        backend="vulkan-spirv",
        default_arch="llvmpipe",
        dtype_support={
            "f32": "planned",
            "f16": "planned",
            "bf16": "planned (emulated, as xpu)",
            "fp8": "planned (emulated, as xpu)",
        },
        attention="fused",
        runs_here="yes, on Mesa lavapipe",
        implemented=False,
    ),
    "cuda": TargetCaps(
        name="cuda",
        device="cuda",
        backend="cuda",
        default_arch="sm_90",
        dtype_support={"f32": "planned", "f16": "planned", "bf16": "planned", "fp8": "planned"},
        attention="fused",
        runs_here="on a lent GPU only",
        implemented=False,
    ),
}


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    """A target with its arch and dtype fixed: everything iree-compile needs."""

    caps: TargetCaps
    arch: str  # as the user named it ("host" included)
    dtype: str
    iree_flags: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.caps.name


def resolve(target: str, arch: str | None, dtype: str, *, dynamic: bool = False) -> ResolvedTarget:
    """Validate target/arch/dtype and build the iree-compile flags. Raises UnsupportedTargetError."""
    caps = TARGETS.get(target)
    if caps is None:
        raise UnsupportedTargetError(
            f"--target={target!r} is not a known target; choose one of: {', '.join(TARGETS)} "
            "(`llmc targets` lists them)"
        )
    if dtype not in DTYPES:
        raise UnsupportedTargetError(f"--dtype={dtype!r} is not a known dtype; choose one of: {', '.join(DTYPES)}")
    if not caps.implemented:
        raise UnsupportedTargetError(
            f"--target={target} is planned but not implemented in this llmc version; use --target=cpu"
        )
    mode = caps.dtype_mode(dtype)
    if mode.startswith("planned") or mode == "unsupported":
        raise UnsupportedTargetError(
            f"--dtype={dtype} on --target={target} is {mode}; use --dtype=f32, f16 or bf16"
        )
    arch = arch or caps.default_arch
    if caps.backend == "llvm-cpu":
        if arch != "host" and arch not in X86_CPUS:
            raise UnsupportedTargetError(
                f"--arch={arch!r} is not a CPU that IREE's LLVM knows for x86-64; use --arch=host or an "
                "LLVM CPU name such as cascadelake, icelake-server, znver4, x86-64-v3"
            )
        flags = [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={arch}",
            # f64 is kept, never silently demoted to f32 (DESIGN.md call semantics).
            "--iree-input-demote-f64-to-f32=false",
        ]
        if dtype == "f32":
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
        return ResolvedTarget(caps, arch, dtype, tuple(flags))
    raise UnsupportedTargetError(f"--target={target}: no flag set defined")  # pragma: no cover


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
