"""compiler/ukernels.py: the C matvec kernels for packed narrow weights on cpu.

The kernels' values are checked against torch's own decode of the same codes (float8_e4m3fn views,
int8 -> f32, bf16 views), never against the kernels' own formula; the compiled ones through the
exact dispatch text llmc gives iree-compile, on shapes that take every tail path of the C loops.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llmc.compiler import targets, ukernels
from llmc.compiler.iree import iree_compile_path
from llmc.errors import CompileError
from llmc.passes import _packed
from llmc.runtime import module as rt_module

# CI installs gcc and sets LLMC_REQUIRE_CPU_KERNELS=1 (.ci/run): there these must run, not skip.
pytestmark = pytest.mark.skipif((ukernels.c_compiler() is None or os.uname().machine != "x86_64")
                                and not os.environ.get("LLMC_REQUIRE_CPU_KERNELS"),
                                reason="needs a C compiler on x86-64")

GROUP = {kind: group for kind, (_, group) in ukernels.GEMM_LAYOUTS.items()}  # the C kernels' layouts (fp8: 32)


def _codes(kind: str, n: int, k: int, seed: int) -> torch.Tensor:
    """Random [n, k] codes of `kind` (fp8: every E4M3FN code but the two NaNs, subnormals included)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "f32":  # the weight itself (f32 weights stored packed: passes/f32_gemm_weights.py)
        return torch.randn(n, k, generator=g) * 0.05
    if kind == "bf16":
        return (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).view(torch.int16)
    codes = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int64)
    if kind in ("fp8", "fp8dp"):
        codes[(codes & 0x7F) == 0x7F] = 0x3F  # 0x7F / 0xFF are NaN in E4M3FN; the quantizer never writes them
    return codes.to(torch.int8)


def _values(kind: str, codes: torch.Tensor) -> torch.Tensor:
    """The weight each code stands for, by torch's own dtypes (fp8: times 2^-120, the kernel's unit)."""
    if kind in ("fp8", "fp8dp"):
        return codes.view(torch.float8_e4m3fn).to(torch.float32) * 2.0**-120
    if kind == "bf16":
        return codes.view(torch.bfloat16).to(torch.float32)
    return codes.to(torch.float32)  # int8, f32


def _reference(kind, x, codes):
    return (x.double() @ _values(kind, codes).double().T).float()


@pytest.mark.parametrize("kind", ["fp8", "int8", "bf16"])
def test_eager_op_is_the_product_with_the_decoded_weight(kind):
    n, k = 5 * GROUP[kind], 24
    codes = _codes(kind, n, k, 1)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(2))
    got = _packed.KERNEL_OPS[kind](x, _packed.pack(codes, GROUP[kind]))
    _assert_within_summation_error(got, x, kind, codes)


def _module(kind: str, groups: int, k: int, m: int | str | None = None) -> str:
    """A module whose main calls the declared kernel function llmc's import makes: the matvec (m None,
    x [1, K]) or the many-row kernel (x [m, K]; m "?": a dynamic row count)."""
    elem, group = (ukernels.KINDS if m is None else ukernels.GEMM_LAYOUTS)[kind]
    rows = 1 if m is None else m
    name = (ukernels.declaration_name(kind, groups, k) if m is None else
            ukernels.gemm_declaration_name(kind, None if m == "?" else m, groups, k))
    tx, tp, ty = f"tensor<{rows}x{k}xf32>", f"tensor<{groups}x{k}x{group}x{elem}>", f"tensor<{rows}x{groups * group}xf32>"
    return (f"module {{\n  func.func private @{name}({tx}, {tp}) -> {ty}\n"
            f"  func.func @main(%x: {tx}, %p: {tp}) -> {ty} {{\n"
            f"    %y = func.call @{name}(%x, %p) : ({tx}, {tp}) -> {ty}\n"
            f"    return %y : {ty}\n  }}\n}}\n")


def _run_linked(tmp_path, text: str, x: torch.Tensor, p: torch.Tensor, cpu: str = "x86-64-v3") -> torch.Tensor:
    """Compile the linked module for `cpu` and run main(x, p) with iree-run-module."""
    src, vmfb = tmp_path / "m.mlir", tmp_path / "m.vmfb"
    src.write_text(text)
    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", f"--iree-llvmcpu-target-cpu={cpu}"]
    subprocess.run([iree_compile_path(), str(src), *flags, "-o", str(vmfb)], check=True, capture_output=True, text=True)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "p.npy", p.numpy())
    run = subprocess.run([str(Path(sys.executable).parent / "iree-run-module"), f"--module={vmfb}",
                          "--device=local-task", "--function=main", f"--input=@{tmp_path / 'x.npy'}",
                          f"--input=@{tmp_path / 'p.npy'}", f"--output=@{tmp_path / 'y.npy'}"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return torch.from_numpy(np.load(tmp_path / "y.npy"))


# groups x K: 8 groups (whole workgroups only), 7 and 3 groups (a workgroup with one group), odd K (the last-k
# tail). bf16 reads groups side by side only from 64 KiB a group (K >= 1024; one at a time below, as fp8 and
# int8 always): 5 x 2053 runs bf16's pairs (2 groups per workgroup) and a one-group workgroup; 5 x 8195 a large
# K with an odd last k (int8's groups are 32 channels since 2026-12-01, 8 before)
@pytest.mark.parametrize("kind, groups, k", [(kind, g, k) for kind in ("fp8", "int8", "bf16")
                                             for g, k in [(8, 64), (7, 37), (3, 768), (5, 2053)]] + [("int8", 5, 8195)])
def test_compiled_kernel_matches_torch(tmp_path, kind, groups, k):
    text = ukernels.link(_module(kind, groups, k))
    assert f"flow.dispatch @{ukernels.EXECUTABLE}::@matvec_{kind}" in text
    group = GROUP[kind]
    codes = _codes(kind, groups * group, k, 3)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4))
    got = _run_linked(tmp_path, text, x, _packed.pack(codes, group))
    # the worst-case bound grows as K x sum|x w| and the values as sqrt(K): at K = 8195 it is 1.4% of them
    _assert_within_summation_error(got, x, kind, codes, tight=1e-2 if k < 4096 else 3e-2)


# Zen 3 builds read every bf16 group pair side by side (ukernels.BF16_PAIR_MIN_K_BY_CPU): pairs with an odd
# group out (7 x 37), pairs only (8 x 64), one pair and a one-group workgroup at small K (3 x 768)
@pytest.mark.parametrize("groups, k", [(8, 64), (7, 37), (3, 768)])
def test_compiled_bf16_kernel_reading_pairs_matches_torch(tmp_path, groups, k):
    text = ukernels.link(_module("bf16", groups, k), arch="znver3")
    assert "%pairk = arith.constant 0 : index" in text
    codes = _codes("bf16", groups * 32, k, 3)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4))
    got = _run_linked(tmp_path, text, x, _packed.pack(codes, 32))
    _assert_within_summation_error(got, x, "bf16", codes)
    # the same sum as the one-stream loop's (2 partial sums per channel either way): bit-identical
    assert torch.equal(got, _run_linked(tmp_path, ukernels.link(_module("bf16", groups, k)), x, _packed.pack(codes, 32)))


# The AVX-512F form only where every CPU of the module has it (a portable module's generic x86-64-v3 lacks it)
@pytest.mark.parametrize("arch, want, function", [
    (None, 1024, "llmc_matvec_bf16"), ("znver4", 1024, "llmc_matvec_bf16_avx512"), ("x86-64-v3", 1024, "llmc_matvec_bf16"),
    ("x86-64-v4", 1024, "llmc_matvec_bf16_avx512"), ("znver3", 0, "llmc_matvec_bf16"), ("znver3,x86-64-v3", 1024, "llmc_matvec_bf16"),
    ("portable", 1024, "llmc_matvec_bf16"), ("x86-64-v4,znver4", 1024, "llmc_matvec_bf16_avx512")])
def test_link_gives_the_bf16_matvec_its_cpus_stream_threshold_and_c_function(arch, want, function):
    text = ukernels.link(_module("bf16", 3, 768), arch=arch)
    assert f"%pairk = arith.constant {want} : index" in text
    assert f"@{ukernels.EXECUTABLE}::@matvec_bf16[%g, %per](%x, %p, %k, %g, %per, %pairk)" in text
    assert f"func.call @{function}(%x, %p, %y, %k, %g, %per, %wg, %pairk)" in text
    assert f"func.func private @{function}(" in text and text.count("func.func private @llmc_matvec_bf16") == 1


_AVX512 = "avx512f" in (rt_module.host_cpu_flags() or set())


# The 512-bit loop's tails as the AVX2 loop's: whole groups only (8 x 64), the one-group tail and odd K (7 x 37),
# small K (3 x 768), pairs from K = 1024 with an odd group out and the last-k tail (5 x 2053)
@pytest.mark.skipif(not _AVX512, reason="runs AVX-512 code: needs a CPU with AVX-512F")
@pytest.mark.parametrize("groups, k", [(8, 64), (7, 37), (3, 768), (5, 2053)])
def test_compiled_avx512_bf16_kernel_matches_torch_and_the_avx2_loop(tmp_path, groups, k):
    text = ukernels.link(_module("bf16", groups, k), arch="x86-64-v4")
    assert "func.call @llmc_matvec_bf16_avx512(" in text
    codes = _codes("bf16", groups * 32, k, 5)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(6))
    got = _run_linked(tmp_path, text, x, _packed.pack(codes, 32), cpu="x86-64-v4")
    _assert_within_summation_error(got, x, "bf16", codes)
    # the same two partial sums per channel as the AVX2 loop, each channel back in its place: bit-identical
    assert torch.equal(got, _run_linked(tmp_path, ukernels.link(_module("bf16", groups, k)), x, _packed.pack(codes, 32)))


def test_link_asks_for_the_cpus_only_for_a_matvec_that_reads_them(monkeypatch):
    """Resolving a CPU name runs iree-compile: a module whose products need nothing of the CPU (here the
    many-row kernel) never pays it; a one-row fp8, int8 or bf16 product asks once."""
    asked = []
    monkeypatch.setattr(targets, "llvm_cpu_features", lambda cpu: asked.append(cpu) or ("znver3", ()))
    text = ukernels.link(_module("fp8", 3, 64, m=4), arch="host")
    assert not asked and "%pairk" not in text and "%ahead" not in text
    assert "%ahead = arith.constant 2048 : index" in ukernels.link(_module("fp8", 3, 64), arch="host") and asked == ["host"]
    assert "%pairk = arith.constant 0 : index" in ukernels.link(_module("bf16", 3, 64), arch="host") and asked == ["host"] * 2
    assert "%ahead" not in ukernels.link(_module("bf16", 3, 64), arch="host")


# fp8's and int8's prefetch distance: the CPUs' own where all agree (MATVEC_PREFETCH_BY_CPU: Zen 3 2048), else 512
@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("arch, want", [(None, 512), ("znver3", 2048), ("znver4", 512), ("x86-64-v3", 512),
                                        ("znver3,x86-64-v3", 512), ("portable", 512)])
def test_link_gives_the_fp8_and_int8_matvec_their_cpus_prefetch_distance(kind, arch, want):
    text = ukernels.link(_module(kind, 3, 768), arch=arch)
    assert text.count("%ahead = arith.constant") == 1 and f"%ahead = arith.constant {want} : index" in text
    assert f"@{ukernels.EXECUTABLE}::@matvec_{kind}[%g, %per](%x, %p, %k, %g, %per, %ahead)" in text
    assert f"func.call @llmc_matvec_{kind}(%x, %p, %y, %k, %g, %per, %wg, %ahead)" in text


# The prefetch distance moves no arithmetic: Zen 3's 2048 bytes against the default 512, bit-identical, with the
# last prefetches past the weights' end (a prefetch never faults) and groups shorter than the distance (K = 37)
@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("groups, k", [(7, 37), (5, 2053)])
def test_compiled_kernel_with_zen3s_prefetch_distance_is_bit_identical(tmp_path, kind, groups, k):
    far = ukernels.link(_module(kind, groups, k), arch="znver3")
    assert "%ahead = arith.constant 2048 : index" in far
    codes = _codes(kind, groups * GROUP[kind], k, 3)  # test_compiled_kernel_matches_torch's codes and x
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4))
    p = _packed.pack(codes, GROUP[kind])
    got = _run_linked(tmp_path, far, x, p)
    _assert_within_summation_error(got, x, kind, codes)
    assert torch.equal(got, _run_linked(tmp_path, ukernels.link(_module(kind, groups, k)), x, p))


def _assert_within_summation_error(got, x, kind, codes, tight=1e-2, split=0.0, flushed_codes=False):
    """Each output within f32 summation's worst case of the exact (f64) sum: K x 2^-24 x sum |x w|, plus, per
    term, the f32 subnormal range: IREE's workers run with denormals flushed to zero (inputs and results),
    and fp8 values are computed x 2^-120, so an E4M3 subnormal code (< 2^-6, x 2^-120 < 2^-126) reads as 0
    and so does a product below 2^-126 (the graph's own decode does the same; docs/targets.md).
    split: a further relative error per term (the fp8 dot-product loop's x halves: 2^-17); flushed_codes: the
    exact sum taken with the E4M3 subnormal codes as 0 and no subnormal range, for a loop that reads those
    codes as 0 and flushes nothing else (the dot-product loop: its products are x 2^32).
    A wrong decode or a wrong channel is off by the size of the terms themselves, orders of magnitude more."""
    if flushed_codes:
        codes = torch.where((codes & 0x78) == 0, torch.zeros_like(codes), codes)
    want = _reference(kind, x, codes)
    k = x.shape[1]
    bound = ((k * 2.0**-24 + split) * (x.double().abs() @ _values(kind, codes).double().abs().T)
             + (0.0 if flushed_codes else k * 2.0**-126 * max(1.0, float(x.abs().max()))))
    assert got.shape == want.shape
    diff = (got.double() - want.double()).abs()
    # a channel whose every term is 0 (its codes all flushed, at small K) has no room at all: exactly 0
    over = torch.where(bound > 0, diff / bound.clamp_min(1e-300), torch.where(diff == 0, 0.0, float("inf")))
    assert float(over.max()) <= 1.0, f"channel {int(over.argmax())}: error {float(over.max()):.3g}x the summation bound"
    assert float(bound.max()) < tight * float(want.abs().max())  # the bound is far tighter than the values checked


@pytest.mark.parametrize("kind", ["fp8", "int8", "bf16", "f32"])
def test_eager_gemm_op_is_the_product_with_the_decoded_weight(kind):
    n, k = 4 * GROUP[kind], 24
    codes = _codes(kind, n, k, 5)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(6))
    got = _packed.GEMM_OPS[kind](x, _packed.pack(codes, GROUP[kind]))
    assert got.shape == (7, n)
    for row in range(7):
        _assert_within_summation_error(got[row:row + 1], x[row:row + 1], kind, codes)


# M x groups x K: whole 6-row blocks and every row tail (13 = 2 x 6 + 1, 11 = 6 + 5, 4), groups over several
# workgroups (40 = 16 workgroups of up to 3; int8: of 4) and fewer than 16, K over several of the fp8/int8
# loop's 128-row blocks with a partial last one (300), odd K
@pytest.mark.parametrize("kind", ["fp8", "int8", "bf16", "f32"])
@pytest.mark.parametrize("m, groups, k", [(13, 40, 64), (11, 4, 37), (4, 6, 300), (2, 2, 8)])
def test_compiled_gemm_kernel_matches_torch(tmp_path, kind, m, groups, k):
    text = ukernels.link(_module(kind, groups, k, m))
    assert f"flow.dispatch @{ukernels.EXECUTABLE}::@gemm_{kind}" in text
    group = GROUP[kind]
    codes = _codes(kind, groups * group, k, 7)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8))
    got = _run_linked(tmp_path, text, x, _packed.pack(codes, group))
    assert got.shape == (m, groups * group)
    for row in range(m):
        _assert_within_summation_error(got[row:row + 1], x[row:row + 1], kind, codes)


@pytest.mark.parametrize("kind", ["fp8", "int8", "bf16", "f32"])
def test_compiled_gemm_kernel_with_a_dynamic_row_count(tmp_path, kind):
    """One module, x [?, K]: 2 rows, and 131 (three of the C loop's 64-row blocks, the last partial)."""
    groups, k = 4, 40
    text = ukernels.link(_module(kind, groups, k, "?"))
    group = GROUP[kind]
    codes = _codes(kind, groups * group, k, 9)
    for m in (2, 131):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(10 + m))
        got = _run_linked(tmp_path, text, x, _packed.pack(codes, group))
        assert got.shape == (m, groups * group)
        for row in range(m):
            _assert_within_summation_error(got[row:row + 1], x[row:row + 1], kind, codes)


def test_int8_gemm_takes_any_group_count_as_fp8_does():
    """32-channel int8 groups are two 16-wide panels each, as fp8's: no kind needs its groups in pairs."""
    assert ukernels.GEMM_GROUP_MULTIPLE == {} and ukernels.KINDS["int8"] == ("i8", 32)
    for kind in ("int8", "fp8"):
        assert [ukernels.gemm_groups_per_workgroup(kind, g) for g in (1, 2, 32, 33, 96)] == [1, 1, 3, 3, 1]


@pytest.mark.parametrize("kind", ["bf16", "fp8", "int8", "f32"])
def test_gemm_workgroup_counts_avoid_few_large_claims(kind):
    """IREE's local-task hands out 8 workgroups at a claim once a dispatch has 8 per worker: a product's
    workgroup count is either small enough to go out one at a time at 2 workers (< 16) or large enough
    for 8 claims or more (>= 64), never 2-7 claims of 8 that leave a late worker holding the product up."""
    step = 1
    for groups in range(step, 1200, step):
        per = ukernels.gemm_groups_per_workgroup(kind, groups)
        workgroups = -(-groups // per)
        assert per % step == 0 and (workgroups < 16 or workgroups >= 64), (groups, per, workgroups)
        assert groups < 64 * step or per == step  # a large product: the finest split


def _cpu(arch: str, dtype: str = "fp8"):
    return targets.resolve("cpu", arch, dtype)


def test_unavailable_names_why(monkeypatch):
    monkeypatch.delenv(ukernels.ENV, raising=False)
    assert ukernels.unavailable(_cpu("x86-64-v3")) is None
    assert ukernels.unavailable(_cpu("portable")) is None  # x86-64-v4 and -v3 both have AVX2 + FMA
    assert "lacks avx2" in ukernels.unavailable(_cpu("x86-64"))
    assert "lacks avx2" in ukernels.unavailable(_cpu("x86-64-v3,x86-64"))  # one object serves every CPU in the module
    assert ukernels.unavailable(targets.resolve("hip", "gfx942", "fp8")) == "not an llvm-cpu target"
    monkeypatch.setenv(ukernels.ENV, "off")
    assert ukernels.unavailable(_cpu("x86-64-v3")) == f"{ukernels.ENV}=off"
    monkeypatch.delenv(ukernels.ENV)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert ukernels.c_compiler() is None
    assert ukernels.unavailable(_cpu("x86-64-v3")).startswith(ukernels.NO_COMPILER)


def test_object_is_cached_and_a_failing_compiler_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMC_CACHE_DIR", str(tmp_path / "cache"))
    first = ukernels.build_object()
    stamp = first.stat().st_mtime_ns
    assert ukernels.build_object() == first and first.stat().st_mtime_ns == stamp  # reused, not rebuilt
    fake = tmp_path / "badcc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo badcc 1.0; exit 0; fi\necho 'badcc: no AVX2 here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(CompileError) as e:
        ukernels.build_object()
    assert "badcc: no AVX2 here" in str(e.value) and "LLMC_CPU_KERNELS=off" in str(e.value)
    assert [p.name for p in (tmp_path / "cache" / "kernels").iterdir()] == [first.name]  # no half-written object


def test_an_object_in_a_folder_others_can_write_is_never_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared" / "kernels"
    shared.mkdir(parents=True)
    monkeypatch.setenv("LLMC_CACHE_DIR", str(tmp_path / "cache"))
    real = ukernels.build_object()  # learn the object's name, then plant a fake one where others can write
    monkeypatch.setenv("LLMC_CACHE_DIR", str(tmp_path / "shared"))
    (shared / real.name).write_bytes(b"not an object")
    shared.chmod(0o777)
    monkeypatch.setattr(ukernels.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    got = ukernels.build_object()
    assert got.parent == tmp_path / "tmp" / f"llmc-kernels-{os.getuid()}"  # the private fallback, built fresh
    assert got.read_bytes() == real.read_bytes()


def test_a_compiler_that_fails_means_no_kernels_not_a_failed_compile(tmp_path, monkeypatch):
    from llmc.compiler import pipeline
    from llmc.passes._packed import KERNEL_OPTION

    monkeypatch.delenv(ukernels.ENV, raising=False)
    monkeypatch.setenv("LLMC_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / "badcc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo badcc 2.0; exit 0; fi\necho 'badcc: unsupported -mavx2' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    why = ukernels.unavailable(_cpu("x86-64-v3"))
    assert why.startswith(ukernels.NO_COMPILER) and "badcc: unsupported -mavx2" in why
    assert pipeline.build(_cpu("x86-64-v3")).ctx.options[KERNEL_OPTION] is False
    monkeypatch.delenv("CC")
    assert pipeline.build(_cpu("x86-64-v3")).ctx.options[KERNEL_OPTION] is True
    assert KERNEL_OPTION not in pipeline.build(_cpu("x86-64-v3", "f32")).ctx.options  # f32 weights are not packed


def test_import_refuses_a_kernel_op_of_another_form():
    """The C kernel has one form (x [1, K] f32, codes [N/32, K, 32] for fp8): an op that does not match is a clear
    compile error (exit 3) at import, not a miscompiled dispatch."""
    from llmc.compiler import export, importer

    class Mismatched(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("p", torch.zeros(2, 4, 8, dtype=torch.int8))

        def forward(self, x):
            return _packed.KERNEL_OPS["fp8"](x, self.p)

    ep = torch.export.export(Mismatched(), (torch.randn(1, 5),))  # K = 5, codes for K = 4
    with pytest.raises(CompileError) as e:
        importer.import_programs([(export.Exported(ep, ""), "main")])
    assert str(e.value) == ("llmc::matvec_fp8 takes x [1, K] f32 and si8 codes [N/32, K, 32], static; "
                            "got !torch.vtensor<[1,5],f32> and !torch.vtensor<[2,4,8],si8>")
    assert e.value.exit_code == 3


@pytest.mark.parametrize("op", ["matvec", "gemm"])
def test_import_refuses_a_pair_layout_op_with_an_odd_k(op):
    """The pair layout holds K pairs: an fp8dp op with an odd K (which the passes never emit) is refused at import."""
    from llmc.compiler import export, importer

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("p", torch.zeros(1, 5, 64, dtype=torch.int8))

        def forward(self, x):
            return (_packed.KERNEL_OPS if op == "matvec" else _packed.GEMM_OPS)["fp8dp"](x, self.p)

    rows = 1 if op == "matvec" else 3
    ep = torch.export.export(Odd(), (torch.randn(rows, 5),))
    with pytest.raises(CompileError) as e:
        importer.import_programs([(export.Exported(ep, ""), "main")])
    assert f"llmc::{op}_fp8dp takes x [{'1' if op == 'matvec' else 'M'}, K] f32 and si8 codes [N/64, K, 64]" in str(e.value)
    assert "K even (the pair layout)" in str(e.value) and e.value.exit_code == 3


def _gemm_program(kind: str, dynamic: bool, k: int = 4):
    """An exported program whose main is llmc::gemm_<kind>(x [M, k], a buffer of zero codes [2, k, G])."""
    elem, group = ukernels.GEMM_LAYOUTS[kind]
    codes = torch.zeros(2, k, group, dtype={"i16": torch.int16, "i8": torch.int8, "f32": torch.float32}[elem])

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("p", codes)

        def forward(self, x):
            return _packed.GEMM_OPS[kind](x, self.p)

    return torch.export.export(Rows(), (torch.randn(3, k),),
                               dynamic_shapes=({0: torch.export.Dim("m", min=2, max=4096)},) if dynamic else None)


def test_import_takes_a_gemm_op_with_a_dynamic_row_count():
    """A dynamic prefill's products: x [?, K] is declared as such; the C loop gets M from x's dim."""
    from llmc.compiler import export, importer

    module, *_ = importer.import_programs([(export.Exported(_gemm_program("bf16", True), ""), "main")])
    text = str(module)
    name = ukernels.gemm_declaration_name("bf16", None, 2, 4)
    assert f"func.func private @{name}(tensor<?x4xf32>, tensor<2x4x32xi16>) -> tensor<?x64xf32>" in text
    linked = ukernels.link(text)
    assert "%m = tensor.dim %x, %c0 : tensor<?x4xf32>" in linked
    assert f"@{ukernels.EXECUTABLE}::@gemm_bf16[%g, %per](%x, %p, %m, %k, %g, %per) : (tensor<?x4xf32>{{%m}}," in linked


def test_import_refuses_a_gemm_op_of_another_form():
    """The codes must be the kind's (bf16: int16 bits); anything else is a clear compile error."""
    from llmc.compiler import export, importer

    ep = _gemm_program("f32", False)
    ep.graph_module.graph.find_nodes(op="call_function", target=_packed.GEMM_OPS["f32"])[0].target = _packed.GEMM_OPS["bf16"]
    with pytest.raises(CompileError) as e:
        importer.import_programs([(export.Exported(ep, ""), "main")])
    assert str(e.value) == ("llmc::gemm_bf16 takes x [M, K] f32 and si16 codes [N/32, K, 32], K and the codes static; "
                            "got !torch.vtensor<[3,4],f32> and !torch.vtensor<[2,4,16],f32>")
    assert e.value.exit_code == 3


def test_link_leaves_a_module_without_kernels_alone():
    text = "module {\n  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n    return %a : tensor<4xf32>\n  }\n}\n"
    assert ukernels.link(text) is text


# ---- the decode attention kernel (passes/decode_attention_kernel.py) ----

def _attention_module(hq: int, hk: int, c: int, d: int, length: int | None, cache: str = "f32") -> str:
    """main(q, kc, vc, bias) calling the declared attention function as llmc's import makes it
    (length None: the bias's last dim, L, is dynamic). cache bf16: main takes the caches as i16 bits
    (iree-run-module reads no bf16 .npy) and bitcasts them to the bf16 tensors the function takes."""
    return _kernel_module(ukernels.attention_declaration_name(hq, hk, c, d, length, cache), f"tensor<1x{hq}x1x{d}xf32>",
                          (hk, c, d), f"tensor<1x1x1x{'?' if length is None else length}xf32>", cache)


def _kernel_module(name: str, tq: str, cache_dims: tuple, tb: str, cache: str) -> str:
    """main(q, kc, vc, bias) -> y calling the declared function `name` (q: tq, caches [1, *cache_dims] of
    `cache` elements, handed in as i16 bits for bf16, bias: tb)."""
    dims = "x".join(str(x) for x in cache_dims)
    tc = f"tensor<1x{dims}x{cache}>"
    ti = tc if cache == "f32" else f"tensor<1x{dims}xi16>"
    cast = "" if cache == "f32" else (f"    %kb = arith.bitcast %k : {ti} to {tc}\n    %vb = arith.bitcast %v : {ti} to {tc}\n")
    k, v = ("%k", "%v") if cache == "f32" else ("%kb", "%vb")
    return (f"module {{\n  func.func private @{name}({tq}, {tc}, {tc}, {tb}) -> {tq}\n"
            f"  func.func @main(%q: {tq}, %k: {ti}, %v: {ti}, %b: {tb}) -> {tq} {{\n{cast}"
            f"    %y = func.call @{name}(%q, {k}, {v}, %b) : ({tq}, {tc}, {tc}, {tb}) -> {tq}\n"
            f"    return %y : {tq}\n  }}\n}}\n")


def _run_module(tmp_path, text: str, *inputs: torch.Tensor) -> torch.Tensor:
    """Compile `text` for x86-64-v3 and run main(*inputs) with iree-run-module."""
    src, vmfb = tmp_path / "m.mlir", tmp_path / "m.vmfb"
    src.write_text(text)
    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=x86-64-v3"]
    subprocess.run([iree_compile_path(), str(src), *flags, "-o", str(vmfb)], check=True, capture_output=True, text=True)
    args = []
    for i, t in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", t.numpy())
        args.append(f"--input=@{tmp_path / f'in{i}.npy'}")
    run = subprocess.run([str(Path(sys.executable).parent / "iree-run-module"), f"--module={vmfb}", "--device=local-task",
                          "--function=main", *args, f"--output=@{tmp_path / 'y.npy'}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return torch.from_numpy(np.load(tmp_path / "y.npy"))


# (Hq, Hk, cache rows C, D, L, static L, cache dtype): small-125m's step (12 on 4, D 64) at 140 of 168 rows,
# dynamic; one row; a block and a bit (ATTN_BLOCK 256 + 9 rows: the 8-row loop, its tail, the next block
# rescaling the first); 8B-like heads (32 on 8, D 128); no grouping (Hq = Hk), the whole cache with a static
# L; and llmc_attn_decode_bf16 (--kv-dtype bf16) at small-125m's step, a block and a bit, and static
@pytest.mark.parametrize("hq, hk, c, d, length, static, cache", [
    (12, 4, 168, 64, 140, False, "f32"), (12, 4, 168, 64, 1, False, "f32"), (6, 2, 300, 16, 265, False, "f32"),
    (32, 8, 40, 128, 40, False, "f32"), (4, 4, 24, 8, 24, True, "f32"),
    (12, 4, 168, 64, 140, False, "bf16"), (6, 2, 300, 16, 265, False, "bf16"), (4, 4, 24, 8, 24, True, "bf16"),
    # the value loop's register groups (up to 3 query heads x 32 columns): 2 heads; 5 = 3 + 2 with D = 32;
    # 8 = 3 + 3 + 2 with D = 96 (32-column groups) across a block boundary; D = 40 (a 32-column group and a tail)
    (16, 8, 64, 64, 50, False, "bf16"), (10, 2, 40, 32, 33, False, "f32"), (8, 1, 300, 96, 290, False, "bf16"),
    (6, 2, 24, 40, 20, False, "f32")])
def test_compiled_attention_kernel_matches_torch(tmp_path, hq, hk, c, d, length, static, cache):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, hq, 1, d, generator=g) * d**-0.5
    kc, vc = torch.randn(1, hk, c, d, generator=g) * 2, torch.randn(1, hk, c, d, generator=g)
    if cache == "bf16":
        kc, vc = kc.bfloat16(), vc.bfloat16()
    bias = torch.zeros(1, 1, 1, length)
    bias[..., 1::3] = float("-inf")  # masked rows, never the first
    if length > 256:
        bias[..., 260] = 3.0  # a score that grows the running maximum in the second block
    caches = (kc, vc) if cache == "f32" else (kc.view(torch.int16), vc.view(torch.int16))
    got = _run_module(tmp_path, ukernels.link(_attention_module(hq, hk, c, d, length if static else None, cache)), q, *caches, bias)
    # the reference reads the cache's own values (a bf16 cache widened exactly, as the kernel widens it)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kc[:, :, :length].double(), vc[:, :, :length].double(),
                                                            attn_mask=bias.double(), scale=1.0, enable_gqa=True)
    assert got.shape == want.shape
    # f32 scores (D products), an exp within 2^-23 relative and f32 sums over L rows: a few ulp of the
    # largest output; a wrong row, head or mask is off by the values themselves (|out| ~ 0.1-1), and a
    # bf16 cache read as f32 bits (or the reverse) by far more
    err = float((got.double() - want).abs().max())
    assert err < 1e-5 * max(1.0, float(want.abs().max())), err
    # the eager op (what a rewritten program runs in torch) is the same attention
    from llmc.passes.decode_attention_kernel import attn_decode

    assert torch.allclose(attn_decode(q, kc, vc, bias).double(), want, atol=1e-5)


def test_compiled_attention_kernel_gives_zero_for_a_row_with_every_key_masked(tmp_path):
    """As PyTorch's SDPA does (torch 2.13 on cpu), rather than softmax's 0 / 0: the compiled kernel and the eager op."""
    from llmc.passes.decode_attention_kernel import attn_decode

    q, kc, vc = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 16, 8), torch.randn(1, 1, 16, 8)
    bias = torch.full((1, 1, 1, 9), float("-inf"))
    bias[..., 0] = 0.0
    got = _run_module(tmp_path, ukernels.link(_attention_module(2, 1, 16, 8, None)), q, kc, vc, torch.full((1, 1, 1, 9), float("-inf")))
    want = torch.nn.functional.scaled_dot_product_attention(q, kc[:, :, :9], vc[:, :, :9], attn_mask=torch.full((1, 1, 1, 9), float("-inf")),
                                                            enable_gqa=True)
    assert bool((want == 0).all()) and bool((got == 0).all())
    assert bool((attn_decode(q, kc, vc, torch.full((1, 1, 1, 9), float("-inf"))) == 0).all())
    # one key kept: its value row exactly
    assert torch.equal(attn_decode(q, kc, vc, bias), vc[:, :, :1].expand(1, 2, 1, 8))


def _kernel_op_program(op: str, rows: int, hq: int, hk: int, d: int, caches=(torch.float32, torch.float32)):
    """An exported program calling llmc::<op>(q [1, hq, rows, d], caches [1, hk, 16, d], bias [1, 1, rows, 5])."""
    import llmc.passes.chunk_attention_kernel  # noqa: F401  (defines llmc::attn_chunk)
    import llmc.passes.decode_attention_kernel  # noqa: F401  (defines llmc::attn_decode)

    call = getattr(torch.ops.llmc, op)

    class Call(torch.nn.Module):
        def forward(self, q, kc, vc, bias):
            return call(q, kc, vc, bias)

    args = (torch.randn(1, hq, rows, d), torch.randn(1, hk, 16, d, dtype=caches[0]), torch.randn(1, hk, 16, d, dtype=caches[1]),
            torch.zeros(1, 1, rows, 5))
    return torch.export.export(Call(), args)


def _attention_program(hq: int, hk: int, d: int, caches=(torch.float32, torch.float32)):
    return _kernel_op_program("attn_decode", 1, hq, hk, d, caches)


def test_import_takes_an_attention_op_and_refuses_shapes_the_kernel_cannot_hold():
    """The op as the pass emits it imports as a call of the declared function; 9 query heads per KV head
    (the kernel's stack holds 8) or D = 12 are a clear compile error, not a kernel run past its arrays."""
    from llmc.compiler import export, importer

    module, *_ = importer.import_programs([(export.Exported(_attention_program(8, 2, 16), ""), "main")])
    name = ukernels.attention_declaration_name(8, 2, 16, 16, 5)
    assert (f"func.func private @{name}(tensor<1x8x1x16xf32>, tensor<1x2x16x16xf32>, tensor<1x2x16x16xf32>, "
            "tensor<1x1x1x5xf32>) -> tensor<1x8x1x16xf32>") in str(module)
    for hq, hk, d in ((9, 1, 16), (2, 2, 12)):
        with pytest.raises(CompileError) as e:
            importer.import_programs([(export.Exported(_attention_program(hq, hk, d), ""), "main")])
        assert str(e.value) == (
            "llmc::attn_decode takes q [1, Hq, 1, D], caches [1, Hk, C, D] (f32 or bf16, both alike) and a bias [1, 1, 1, L], "
            "q and the bias f32, all static but L, with at most 8 query heads per KV head and D a multiple of 8 up to 256; "
            f"got !torch.vtensor<[1,{hq},1,{d}],f32>, !torch.vtensor<[1,{hk},16,{d}],f32>, !torch.vtensor<[1,{hk},16,{d}],f32>, "
            "!torch.vtensor<[1,1,1,5],f32>")
        assert e.value.exit_code == 3
    # a bf16 cache: the bf16 kernel's declaration over the bf16 tensors; one bf16 and one f32 cache: refused
    module, *_ = importer.import_programs([(export.Exported(_attention_program(8, 2, 16, (torch.bfloat16,) * 2), ""), "main")])
    name = ukernels.attention_declaration_name(8, 2, 16, 16, 5, "bf16")
    assert name.startswith(ukernels.ATTN_DECL_PREFIX + "bf16_")
    assert (f"func.func private @{name}(tensor<1x8x1x16xf32>, tensor<1x2x16x16xbf16>, tensor<1x2x16x16xbf16>, "
            "tensor<1x1x1x5xf32>) -> tensor<1x8x1x16xf32>") in str(module)
    with pytest.raises(CompileError, match=r"got .*\[1,2,16,16\],bf16>, !torch.vtensor<\[1,2,16,16\],f32>"):
        importer.import_programs([(export.Exported(_attention_program(8, 2, 16, (torch.bfloat16, torch.float32)), ""), "main")])



# ---- the prefill-chunk attention kernel (passes/chunk_attention_kernel.py) ----

def _chunk_module(hq: int, hk: int, c: int, cm: int, d: int, length: int | None, cache: str = "f32") -> str:
    """main(q, kc, vc, bias) calling the declared chunk attention function as llmc's import makes it (length
    None: L dynamic; a bf16 cache comes in as i16 bits, as in _attention_module)."""
    return _kernel_module(ukernels.chunk_attention_declaration_name(hq, hk, c, cm, d, length, cache), f"tensor<1x{hq}x{c}x{d}xf32>",
                          (hk, cm, d), f"tensor<1x1x{c}x{'?' if length is None else length}xf32>", cache)


# (Hq, Hk, C, cache rows, D, L, static L, cache dtype): small-125m's 64-token chunk after 66 cached rows (two key
# blocks, the second of 2 rows: a tail of keys under 4); 20 positions (16 a workgroup: the second block of
# positions 4 long, the rest padding); 8B-like heads (32 on 8, D 128: 8 positions a workgroup) over 3 key blocks
# and a bit; one query head per KV head, 2 positions, a static L; 1B-like heads (32 on 8, D 64: 64 rows a
# workgroup, tiles of 6 rows and one of 4); 8 query heads on one (8 positions a workgroup, 64 rows); D 512
# (the largest the stack holds) over 2 keys, fewer than the 3 positions; and the bf16-cache kernel on the first three
@pytest.mark.parametrize("hq, hk, c, cm, d, length, static, cache", [
    (12, 4, 64, 168, 64, 130, False, "f32"), (6, 2, 20, 80, 16, 75, False, "f32"), (32, 8, 24, 220, 128, 197, False, "f32"),
    (4, 4, 2, 24, 32, 24, True, "f32"), (32, 8, 64, 100, 64, 90, False, "f32"), (8, 1, 9, 40, 64, 33, False, "f32"),
    (2, 2, 3, 20, 512, 2, False, "f32"),
    (12, 4, 64, 168, 64, 130, False, "bf16"), (6, 2, 20, 80, 16, 75, False, "bf16"), (32, 8, 24, 220, 128, 197, False, "bf16")])
def test_compiled_chunk_attention_kernel_matches_torch(tmp_path, hq, hk, c, cm, d, length, static, cache):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, hq, c, d, generator=g) * d**-0.5
    kc, vc = torch.randn(1, hk, cm, d, generator=g) * 2, torch.randn(1, hk, cm, d, generator=g)
    if cache == "bf16":
        kc, vc = kc.bfloat16(), vc.bfloat16()
    # the chunk's mask: position i (at length - c + i) sees keys up to its own; keys 1, 4, 7, ... padding; a
    # score far above the rest in the last key block (a running maximum that grows late)
    keep = torch.arange(length)[None] <= torch.arange(length - c, length)[:, None]
    keep[:, 1::3] = False
    bias = torch.where(keep, 0.0, float("-inf"))[None, None]
    bias[..., 0, :] = float("-inf")  # position 0 keeps no key: its output is 0
    bias[..., 1:, length - c] = 4.0
    caches = (kc, vc) if cache == "f32" else (kc.view(torch.int16), vc.view(torch.int16))
    got = _run_module(tmp_path, ukernels.link(_chunk_module(hq, hk, c, cm, d, length if static else None, cache)), q, *caches, bias)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kc[:, :, :length].double(), vc[:, :, :length].double(),
                                                            attn_mask=bias.double(), scale=1.0, enable_gqa=True).nan_to_num(0.0)
    assert got.shape == want.shape
    assert bool((got[:, :, 0] == 0).all())
    # f32 scores over D, an exp within 2^-23 relative, f32 sums over L keys: a few ulp of the largest
    # output; a wrong head, position, key block or mask row is off by the values themselves
    err = float((got.double() - want).abs().max())
    assert err < 1e-5 * max(1.0, float(want.abs().max())), err
    from llmc.passes.chunk_attention_kernel import attn_chunk

    eager = attn_chunk(q, kc, vc, bias).double()
    assert bool((eager[:, :, 0] == 0).all())
    assert torch.allclose(eager, want, atol=1e-5)


def _chunk_program(hq: int, hk: int, d: int, caches=(torch.float32, torch.float32)):
    return _kernel_op_program("attn_chunk", 4, hq, hk, d, caches)


def test_import_takes_a_chunk_attention_op_and_refuses_shapes_the_kernel_cannot_hold():
    """The op imports as a call of the declared function; heads whose rows would overrun the kernel's stack
    arrays (9 per KV head; 8 x 8 x D 128 > 4096) or a head size not a multiple of 16 are a clear compile error."""
    from llmc.compiler import export, importer

    module, *_ = importer.import_programs([(export.Exported(_chunk_program(8, 2, 32), ""), "main")])
    name = ukernels.chunk_attention_declaration_name(8, 2, 4, 16, 32, 5)
    assert (f"func.func private @{name}(tensor<1x8x4x32xf32>, tensor<1x2x16x32xf32>, tensor<1x2x16x32xf32>, "
            "tensor<1x1x4x5xf32>) -> tensor<1x8x4x32xf32>") in str(module)
    module, *_ = importer.import_programs([(export.Exported(_chunk_program(8, 2, 32, (torch.bfloat16,) * 2), ""), "main")])
    assert f"@{ukernels.chunk_attention_declaration_name(8, 2, 4, 16, 32, 5, 'bf16')}(" in str(module)
    for hq, hk, d in ((9, 1, 16), (8, 1, 128), (2, 2, 24)):
        with pytest.raises(CompileError) as e:
            importer.import_programs([(export.Exported(_chunk_program(hq, hk, d), ""), "main")])
        assert str(e.value).startswith("llmc::attn_chunk takes q [1, Hq, C, D], caches [1, Hk, Cm, D]"), str(e.value)
        assert f"{hq} query heads on {hk}, head size {d}" in str(e.value)
        assert e.value.exit_code == 3
    # operands of the wrong shape (a bias of 3 rows for 4 query rows): the same refusal, naming the types
    class Bad(torch.nn.Module):
        def forward(self, q, kc, vc, bias):
            return torch.ops.llmc.attn_chunk(q, kc, vc, bias)

    args = (torch.randn(1, 8, 4, 32), torch.randn(1, 2, 16, 32), torch.randn(1, 2, 16, 32), torch.zeros(1, 1, 3, 5))
    with pytest.raises(CompileError) as e:
        importer.import_programs([(export.Exported(torch.export.export(Bad(), args), ""), "main")])
    assert str(e.value) == (
        "llmc::attn_chunk takes q [1, Hq, C, D], caches [1, Hk, Cm, D] (f32 or bf16, both alike) and a bias [1, 1, C, L], "
        "q and the bias f32, all static but L, heads the kernel holds; got !torch.vtensor<[1,8,4,32],f32>, "
        "!torch.vtensor<[1,2,16,32],f32>, !torch.vtensor<[1,2,16,32],f32>, !torch.vtensor<[1,1,3,5],f32>")
    assert e.value.exit_code == 3


def test_compiled_attention_kernels_keep_a_nan(tmp_path):
    """A NaN in a query row gives that row NaN, as PyTorch's SDPA does, in both attention kernels (their
    exponential once clamped a NaN score to e^-87 and returned a finite average); the other rows stay right."""
    g = torch.Generator().manual_seed(9)
    q, kc, vc = torch.randn(1, 4, 3, 16, generator=g), torch.randn(1, 2, 24, 16, generator=g), torch.randn(1, 2, 24, 16, generator=g)
    q[0, 1, 2, 5] = float("nan")
    bias = torch.zeros(1, 1, 3, 20)
    got = _run_module(tmp_path, ukernels.link(_chunk_module(4, 2, 3, 24, 16, None)), q, kc, vc, bias)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kc[:, :, :20].double(), vc[:, :, :20].double(),
                                                            attn_mask=bias.double(), scale=1.0, enable_gqa=True)
    assert bool(got[0, 1, 2].isnan().all()) and bool(want[0, 1, 2].isnan().all())
    rest = ~want.isnan()
    # the other rows: the kernel's f32 tolerance of the tests above (outputs here are at most ~2)
    assert int(rest.sum()) == 4 * 3 * 16 - 16 and torch.allclose(got.double()[rest], want[rest], atol=1e-5)
    q1 = q[:, :, 2:3].contiguous()
    got = _run_module(tmp_path, ukernels.link(_attention_module(4, 2, 24, 16, None)), q1, kc, vc, bias[:, :, :1])
    assert bool(got[0, 1, 0].isnan().all()) and not bool(got[0, [0, 2, 3]].isnan().any())


# ---- fp8 in the pair layout (kind fp8dp): the dot-product loop for CPUs with AVX512_BF16 ----


def test_pair_layout_puts_each_channels_k_pair_in_one_32_bit_lane():
    """Every code lands where passes/_packed.py and the C loop say: group b = c // 64, j = c % 64; the K pair
    block k // 2 (128 bytes), vector q = j // 16 (32 bytes), dword d = j % 8, byte 2 (k % 2) + (j // 8) % 2.
    Computed from that formula alone, not from pack_pairs' own reshapes; and pairs_to_groups gives the plain
    layout pack(w, 64) gives."""
    n, k = 130, 6  # rows padded to 192
    w = torch.arange(n * k, dtype=torch.int32).reshape(n, k)
    p = _packed.pack_pairs(w)
    assert p.shape == (3, k, 64)
    flat = p.reshape(-1)
    for c in range(n):
        b, j = divmod(c, 64)
        for kk in range(k):
            at = b * k * 64 + (kk // 2) * 128 + (j // 16) * 32 + (j % 8) * 4 + 2 * (kk % 2) + (j // 8) % 2
            assert int(flat[at]) == int(w[c, kk]), (c, kk)
    plain = _packed.pairs_to_groups(p)
    assert torch.equal(plain, _packed.pack(w, 64)) and not plain[2, :, 2:].any()  # the padded rows (130..191) are 0
    with pytest.raises(ValueError, match="even K"):
        _packed.pack_pairs(w[:, :5])


@pytest.mark.parametrize("op", ["matvec", "gemm"])
def test_eager_pair_ops_are_the_product_with_the_decoded_weight(op):
    n, k = 3 * 64, 24
    codes = _codes("fp8", n, k, 11)
    rows = 1 if op == "matvec" else 5
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(12))
    got = (_packed.KERNEL_OPS if op == "matvec" else _packed.GEMM_OPS)["fp8dp"](x, _packed.pack_pairs(codes))
    for row in range(rows):
        _assert_within_summation_error(got[row:row + 1], x[row:row + 1], "fp8", codes)


# Only where every CPU of the module has AVX512_BF16 (and AVX-512F / VL): Zen 4, Cooper Lake and Sapphire Rapids
# do; x86-64-v4, Ice Lake, x86-64-v3 and portable's generic CPUs do not
@pytest.mark.parametrize("arch, want", [
    (None, False), ("znver4", True), ("sapphirerapids", True), ("cooperlake", True), ("x86-64-v4", False),
    ("icelake-server", False), ("x86-64-v3", False), ("portable", False), ("znver4,sapphirerapids", True),
    ("znver4,x86-64-v3", False)])
def test_fp8_pairs_only_where_every_cpu_has_the_dot_products(arch, want):
    assert ukernels.fp8_pairs(arch) is want


def test_link_gives_the_pair_kernel_x_as_bf16_halves():
    text = ukernels.link(_module("fp8dp", 3, 768))
    assert "%xq = linalg.generic" in text and "ins(%x : tensor<1x768xf32>) outs(%xe : tensor<2x768xi16>)" in text
    assert f"@{ukernels.EXECUTABLE}::@matvec_fp8dp[%g, %per](%xq, %p, %k, %g, %per) : (tensor<2x768xi16>, tensor<3x768x64xi8>" in text
    assert "func.func private @llmc_matvec_fp8dp(memref<?xi16>, memref<?xi8>, memref<?xf32>" in text
    assert "func.call @llmc_matvec_fp8dp(%x, %p, %y, %k, %g, %per, %wg)" in text
    # an fp8 matvec in the plain layout keeps its f32 x
    assert "%xq" not in ukernels.link(_module("fp8", 3, 768))


def _fp8_halves_module(k: int) -> str:
    """A module whose main returns the dot-product loop's x halves (ukernels.fp8_x_halves) of x [1, K]."""
    body = "\n".join("  " + line for line in ukernels.fp8_x_halves(k))
    return (f"module {{\n  func.func @main(%x: tensor<1x{k}xf32>) -> tensor<2x{k}xi16> {{\n{body}\n"
            f"    return %xq : tensor<2x{k}xi16>\n  }}\n}}\n")


def test_fp8_x_halves_are_x_rounded_to_bf16_and_its_remainder(tmp_path):
    """hi = bf16(x * 2^32) and lo = bf16(x * 2^32 - hi), both rounded to nearest even as torch rounds: ties
    (1 + 2^-8 rounds to 1, 1 + 3 * 2^-8 to 1 + 2^-6), signs, magnitudes from 1e-12 to 1e12, and inf and NaN,
    which stay inf and NaN in hi. (Written with arith.truncf / extf, IREE 3.13 gave lo = 0 everywhere.)"""
    special = torch.tensor([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, -1 - 2.0**-8, 3.14159265, -2.7182818, 0.0, -0.0,
                            2.0**90, -(2.0**-40), 1e-30, float("inf"), float("-inf"), float("nan")])
    g = torch.Generator().manual_seed(8)
    rand = torch.randn(50, generator=g) * torch.pow(10.0, torch.empty(50).uniform_(-12, 12, generator=g))
    x = torch.cat([special, rand]).reshape(1, -1).float()
    got = _run_module(tmp_path, _fp8_halves_module(x.shape[1]), x)
    scaled = x[0] * ukernels.FP8_X_SCALE
    hi = scaled.to(torch.bfloat16)
    lo = (scaled - hi.float()).to(torch.bfloat16)
    finite = torch.isfinite(scaled)
    assert torch.equal(got[0][finite], hi[finite].view(torch.int16))
    assert torch.equal(got[1][finite], lo[finite].view(torch.int16))
    assert torch.equal(got[0].view(torch.bfloat16)[~finite].float().nan_to_num(0.5), hi[~finite].float().nan_to_num(0.5))
    assert int((got[1][finite] != 0).sum()) > 40  # the remainders are there: most x' need more than bf16's 8 bits


_PAIRS = all(rt_module.host_has(rt_module.host_cpu_flags(), f) for f in ukernels.FP8_PAIR_FEATURES)


# whole workgroups (8 x 64), a one-group workgroup (7 x 38, 3 x 768), the smallest K (5 x 2), the 8B's down K
@pytest.mark.skipif(not _PAIRS, reason="runs AVX512_BF16 code: needs a CPU with it (Zen 4, Sapphire Rapids)")
@pytest.mark.parametrize("groups, k", [(8, 64), (7, 38), (3, 768), (5, 2), (2, 14336)])
def test_compiled_pair_kernel_matches_torch(tmp_path, groups, k):
    text = ukernels.link(_module("fp8dp", groups, k))
    codes = _codes("fp8", groups * 64, k, 13)
    g = torch.Generator().manual_seed(14)
    x = torch.randn(1, k, generator=g) * torch.pow(10.0, torch.empty(1, k).uniform_(-3, 3, generator=g))
    got = _run_linked(tmp_path, text, x, _packed.pack_pairs(codes))
    # x in two bf16 halves: each term off by at most 2^-17 of itself, on top of f32 summation's bound; the
    # subnormal codes read as 0 (vdpbf16ps takes no subnormal input) and no product is small enough to flush
    _assert_within_summation_error(got, x, "fp8", codes, split=2.0**-17, flushed_codes=True, tight=3e-2)


# the many-row loop over the pair layout is AVX2 code (it runs on every CPU the kernels serve): row tails,
# several workgroups, K over several 128-row blocks with a partial last one, a dynamic row count
@pytest.mark.parametrize("m, groups, k", [(13, 40, 64), (4, 6, 300), (2, 2, 8), ("?", 3, 40)])
def test_compiled_pair_gemm_kernel_matches_torch(tmp_path, m, groups, k):
    text = ukernels.link(_module("fp8dp", groups, k, m))
    assert f"flow.dispatch @{ukernels.EXECUTABLE}::@gemm_fp8dp" in text and "func.call @llmc_gemm_fp8dp(" in text
    codes = _codes("fp8", groups * 64, k, 15)
    for rows in ((2, 131) if m == "?" else (m,)):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(16 + rows))
        got = _run_linked(tmp_path, text, x, _packed.pack_pairs(codes))
        assert got.shape == (rows, groups * 64)
        for row in range(rows):
            _assert_within_summation_error(got[row:row + 1], x[row:row + 1], "fp8", codes)
