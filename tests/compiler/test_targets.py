import pytest

from llmc.compiler import targets
from llmc.errors import UnsupportedTargetError


def test_cpu_flags_follow_research():
    r = targets.resolve("cpu", None, "f32")
    assert r.arch == "host"
    assert "--iree-llvmcpu-target-cpu=host" in r.iree_flags and "--iree-opt-data-tiling=true" in r.iree_flags
    assert "--iree-dispatch-creation-block-matmul-producer-fusion=false" not in r.iree_flags
    bf = targets.resolve("cpu", "znver4", "bf16", dynamic=True)
    assert "--iree-llvmcpu-target-cpu=znver4" in bf.iree_flags
    assert not any("data-tiling" in f for f in bf.iree_flags)  # 50x slower for bf16 compute: see targets.py
    dyn = targets.resolve("cpu", None, "f32", dynamic=True)
    assert "--iree-global-opt-data-tiling=true" in dyn.iree_flags  # dynamic shapes: see targets.py
    assert "--iree-dispatch-creation-block-matmul-producer-fusion=false" in bf.iree_flags


@pytest.mark.parametrize(
    "target,arch,dtype,needle",
    [
        ("tpu", None, "f32", "--target='tpu'"),
        ("cpu", "pentium9000", "f32", "--arch='pentium9000'"),
        ("cpu", None, "f4", "--dtype='f4'"),
        ("cpu", None, "fp8", "--dtype=fp8"),
        ("hip", None, "f32", "--target=hip is planned"),
    ],
)
def test_rejected_before_iree(target, arch, dtype, needle):
    with pytest.raises(UnsupportedTargetError) as info:
        targets.resolve(target, arch, dtype)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_planned_targets_resolve_for_passes_only_with_known_archs():
    hip = targets.resolve("hip", "gfx950", "fp8", allow_planned=True)  # llmc-opt: passes see its caps
    assert hip.arch_caps.fp8 == "e4m3fn" and targets.resolve("hip", None, "f32", allow_planned=True).arch_caps.fp8 == "e4m3fnuz"
    with pytest.raises(UnsupportedTargetError, match="--arch='gfx9000' is not an arch of --target=hip; known: gfx942, gfx950"):
        targets.resolve("hip", "gfx9000", "f32", allow_planned=True)


def test_cpu_features_come_from_iree():
    cpu, feats = targets.llvm_cpu_features("haswell")
    assert cpu == "haswell"
    assert "avx2" in feats and "fma" in feats and "avx512f" not in feats
    _, skx = targets.llvm_cpu_features("skylake-avx512")
    assert "avx512f" in skx
