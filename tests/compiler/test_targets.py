import pytest

from llmc.compiler import targets
from llmc.errors import UnsupportedTargetError


def test_cpu_flags_follow_research():
    r = targets.resolve("cpu", None, "f32")
    assert r.arch == "host"
    assert "--iree-llvmcpu-target-cpu=host" in r.iree_flags and "--iree-opt-data-tiling=true" in r.iree_flags
    assert "--iree-global-opt-use-im2col-for-convs" in r.iree_flags  # convolutions as im2col + matmul: docs/int8.md
    assert "--iree-dispatch-creation-block-matmul-producer-fusion=false" not in r.iree_flags
    half = targets.resolve("cpu", "znver4", "f16", dynamic=True)
    assert "--iree-llvmcpu-target-cpu=znver4" in half.iree_flags
    assert not any("data-tiling" in f for f in half.iree_flags)  # 50x slower for narrow compute: see targets.py
    assert "--iree-dispatch-creation-block-matmul-producer-fusion=false" in half.iree_flags
    dyn = targets.resolve("cpu", None, "f32", dynamic=True)
    assert "--iree-global-opt-data-tiling=true" in dyn.iree_flags  # dynamic shapes: see targets.py
    # bf16 is bf16 weights under f32 math: data tiling on, the widening kept in the dispatches that
    # read the weights (not hoisted to load time). No aggressive fusion: no decode gain, and static-length
    # prefills fail to compile with it (targets.py).
    bf = targets.resolve("cpu", None, "bf16", dynamic=True)
    assert bf.compute_dtype == "f32" and "--iree-global-opt-data-tiling=true" in bf.iree_flags
    for flag in ("--iree-opt-const-expr-max-size-increase-threshold=0", "--iree-dispatch-creation-block-matmul-producer-fusion=false"):
        assert flag in bf.iree_flags and flag not in dyn.iree_flags
    for dtype in ("bf16", "fp8", "int8"):
        assert not any("aggressive-fusion" in f for f in targets.resolve("cpu", None, dtype, dynamic=True).iree_flags)


@pytest.mark.parametrize(
    "target,arch,dtype,needle",
    [
        ("tpu", None, "f32", "--target='tpu'"),
        ("cpu", "pentium9000", "f32", "--arch='pentium9000'"),
        ("cpu", None, "f4", "--dtype='f4'"),
        ("cpu", None, "int4", "--dtype='int4' is not a known dtype; choose one of: f32, f16, bf16, fp8, int8"),
        ("hip", "gfx90a", "f32", "known: gfx942 (mi300x/mi300a/mi325x/cdna3), gfx950"),
        ("vulkan", "lavapipe2", "f32", "--arch='lavapipe2' is not an arch of --target=vulkan"),
        ("xpu", "arc-pro", "f16", "known: arc (a770/"),
        ("cuda", "sm_100", "f32", "sm_90 (h100/"),
        # Adreno has no 8-bit storage buffers: IREE cannot load int8 (or fp8 bytes) there at all
        ("vulkan", "adreno", "int8", "--dtype=int8 --target=vulkan --arch=adreno: the device has no 8-bit storage"),
        ("vulkan", "adreno", "fp8", "no 8-bit storage"),
    ],
)
def test_rejected_before_iree(target, arch, dtype, needle):
    with pytest.raises(UnsupportedTargetError) as info:
        targets.resolve(target, arch, dtype)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_planned_dtypes_resolve_for_passes_only_with_known_archs():
    hip = targets.resolve("hip", "gfx950", "fp8", allow_planned=True)  # llmc-opt: passes see its caps
    assert hip.arch_caps.fp8 == "e4m3fn" and targets.resolve("hip", None, "f32").arch_caps.fp8 == "e4m3fnuz"
    with pytest.raises(UnsupportedTargetError, match="--arch='gfx9000' is not an arch of --target=hip; known: gfx942"):
        targets.resolve("hip", "gfx9000", "f32", allow_planned=True)


@pytest.mark.parametrize(
    "target,arch,want_arch,want",
    [
        ("hip", None, "gfx942", ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"]),
        ("hip", "MI355X", "gfx950", ["--iree-rocm-target=gfx950"]),
        ("hip", "rx7900xtx", "gfx1100", ["--iree-rocm-target=gfx1100"]),
        ("cuda", "a100", "sm_80", ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]),
        ("vulkan", None, "llvmpipe", ["--iree-hal-target-device=vulkan", "--iree-vulkan-target=llvmpipe"]),
        ("vulkan", "rtx4090", "ada", ["--iree-vulkan-target=ada"]),
    ],
)
def test_gpu_archs_named_by_flags(target, arch, want_arch, want):
    r = targets.resolve(target, arch, "f16")
    assert r.arch == want_arch and r.module_target is None
    assert all(f in r.iree_flags for f in want), r.iree_flags
    assert not any("llvmcpu" in f or "data-tiling" in f for f in r.iree_flags)


def test_archs_iree_lacks_are_written_into_the_module():
    # sm_90: IREE 3.13's CUDA table stops at sm_89; the module carries sm_89's capabilities named sm_90.
    h100 = targets.resolve("cuda", "h100", "bf16")
    assert h100.arch == "sm_90" and not any(f.startswith(("--iree-cuda-target", "--iree-hal-target-device")) for f in h100.iree_flags)
    assert h100.module_target.startswith('[#hal.device.target<"cuda"') and 'arch = "sm_90"' in h100.module_target
    assert "sm_89" not in h100.module_target and "NV_MMA_SYNC" in h100.module_target  # sm_89's wgp, asked of iree-compile
    # Intel: no IREE Vulkan target at all; llmc's profile, with its subgroup sizes and no fp64.
    arc = targets.resolve("xpu", None, "f16")
    assert arc.arch == "arc" and arc.iree_flags == ()  # no fp64 on Arc: f64 is demoted (IREE default)
    assert 'arch = "intel-arc"' in arc.module_target and "subgroup_size_choices = [32, 16]" in arc.module_target
    assert "fp64" not in arc.module_target and "mma = []" in arc.module_target
    xe2 = targets.resolve("xpu", "b580", "f32")
    assert xe2.arch == "xe2" and 'arch = "intel-xe2"' in xe2.module_target


def test_bf16_on_spirv_is_f32_compute_with_bf16_weights():
    vk = targets.resolve("vulkan", None, "bf16")
    assert vk.compute_dtype == "f32" and vk.caps.dtypes["bf16"].how == "emulated"
    assert not any("bf16" in f for f in vk.iree_flags)  # no --iree-input-promote-bf16-to-f32: it breaks the ABI
    assert targets.resolve("hip", None, "bf16").compute_dtype == "bf16"
    # cpu too: without avx512_bf16 bf16 math is slower than f32 (compiler/targets.py _CPU_BF16).
    cpu = targets.resolve("cpu", None, "bf16")
    assert cpu.compute_dtype == "f32" and cpu.caps.dtypes["bf16"].how == "emulated"


def test_spirv_decomposes_attention_hip_and_cuda_fuse_it():
    modes = {n: c.attention for n, c in targets.TARGETS.items()}
    assert modes == {"cpu": "decompose", "hip": "fused", "xpu": "decompose", "vulkan": "decompose", "cuda": "fused"}


def test_cpu_features_come_from_iree():
    cpu, feats = targets.llvm_cpu_features("haswell")
    assert cpu == "haswell"
    assert "avx2" in feats and "fma" in feats and "avx512f" not in feats
    _, skx = targets.llvm_cpu_features("skylake-avx512")
    assert "avx512f" in skx


def test_fp8_decodes_where_iree_lowers_it_and_computes_in_the_table_dtype():
    assert targets.resolve("cpu", None, "fp8").compute_dtype == "f32"
    for target, arch, flavour in [("hip", "gfx942", "e4m3fnuz"), ("hip", "gfx950", "e4m3fn"), ("hip", "gfx1100", "none"),
                                  ("cuda", "sm_90", "none"), ("xpu", None, "none"), ("vulkan", None, "none")]:
        r = targets.resolve(target, arch, "fp8")
        assert r.compute_dtype == "f16" and r.arch_caps.fp8 == flavour, (target, arch)
    cpu = targets.resolve("cpu", None, "fp8", dynamic=True)
    assert "--iree-global-opt-data-tiling=true" in cpu.iree_flags  # multi-row products read a whole decoded weight
    assert "--iree-dispatch-creation-block-matmul-producer-fusion=false" in cpu.iree_flags  # the decode fuses into the matmul
