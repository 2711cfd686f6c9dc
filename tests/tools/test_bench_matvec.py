"""tools/bench_matvec.py: the kernels' driver builds against llmc's own object, runs a step's products in
decode order with llmc's workgroup split, and its sums are the products of the decoded weights."""

from __future__ import annotations

import json
import math
import os

import pytest

from llmc.compiler import ukernels
from llmc.runtime import module as rt_module

pytestmark = pytest.mark.skipif((ukernels.c_compiler() is None or os.uname().machine != "x86_64")
                                and not os.environ.get("LLMC_REQUIRE_CPU_KERNELS"),
                                reason="needs a C compiler on x86-64")


def test_products_are_a_step_in_decode_order():
    from llmc.models.llama.config import get_config
    from llmc.tools import bench_matvec

    c = get_config("llama3-8b")
    shapes = bench_matvec.products(c, 2, head=True)
    layer = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336)]
    assert shapes == layer * 2 + [(128256, 4096)]
    assert bench_matvec.products(c, 1, head=False) == layer


def test_spec_carries_llmc_workgroup_split_and_the_bf16_function():
    from llmc.tools import bench_matvec

    text = bench_matvec.spec("fp8", [(4096, 4096), (4096, 14336)], "x86-64-v3")
    # 128 groups of 32 at K = 4096: 128 KiB a group, two a workgroup (the loop's step); K = 14336 likewise
    # the third field: fp8's and int8's prefetch distance as the compile links it (Zen 3's own, else 512)
    assert text == (f"fp8:llmc_matvec_fp8:512:32:128x4096x{ukernels.groups_per_workgroup('fp8', 128, 4096)},"
                    f"128x14336x{ukernels.groups_per_workgroup('fp8', 128, 14336)}")
    pair_min_k, function = ukernels.bf16_matvec("x86-64-v3")
    assert bench_matvec.spec("bf16", [(256, 768)], "x86-64-v3").startswith(f"bf16:{function}:{pair_min_k}:32:8x768x")
    # int8's groups as the compile packs them (32 channels since 2026-12-01)
    assert bench_matvec.spec("int8", [(256, 768)], "x86-64-v3").startswith(f"int8:llmc_matvec_int8:512:{ukernels.KINDS['int8'][1]}:")
    assert bench_matvec.spec("int8", [(256, 768)], "znver3").startswith("int8:llmc_matvec_int8:2048:")


def test_runs_each_kind_and_its_sums_match_the_decoded_weights(tmp_path, capsys):
    from llmc.tools import bench_matvec

    out = tmp_path / "r.json"
    assert bench_matvec.main(["--config", "tiny", "--rounds", "2", "--arch", "x86-64-v3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    table = capsys.readouterr().out
    for kind in ("fp8", "bf16", "int8"):
        r = report["kinds"][kind]
        assert len(r["rounds"]) == 2 and f"| {kind} |" in table
        # f32 summation of the first product against its double-precision sum, relative to sum |x w|
        assert 0 <= r["check"] < 1e-5, r["check"]
        assert r["gb_s"] > 0 and r["ratio"] > 0
    # the bytes each kind streams: its weights at 1 (fp8, int8) or 2 (bf16) bytes, groups padded to G channels
    from llmc.models.llama.config import get_config

    shapes = bench_matvec.products(get_config("tiny"), get_config("tiny").n_layers, head=True)
    for kind, g in (("fp8", 32), ("int8", ukernels.KINDS["int8"][1]), ("bf16", 32)):
        want = sum(-(-n // g) * g * k for n, k in shapes) * bench_matvec.BYTES[kind]
        assert report["kinds"][kind]["rounds"][0]["bytes"] == want
    assert report["weight_bytes"] == max(r["rounds"][0]["bytes"] for r in report["kinds"].values())


_PAIRS = all(rt_module.host_has(rt_module.host_cpu_flags(), f) for f in ukernels.FP8_PAIR_FEATURES)


def test_spec_of_the_pair_layout():
    from llmc.tools import bench_matvec

    # 64 groups of 64 at K = 4096: 256 KiB a group
    assert bench_matvec.spec("fp8dp", [(4096, 4096)], "znver4") == f"fp8dp:llmc_matvec_fp8dp:0:64:64x4096x{ukernels.groups_per_workgroup('fp8dp', 64, 4096)}"


@pytest.mark.skipif(not _PAIRS, reason="runs AVX512_BF16 code: needs a CPU with it (Zen 4, Sapphire Rapids)")
def test_runs_the_pair_layout_and_its_sums_match_the_decoded_weights(tmp_path):
    """The driver reads fp8dp's codes in the pair layout and gives its loop x's bf16 halves: the check against
    the decoded weights holds to the halves' 2^-17 plus f32 summation (a wrong layout is off by the terms)."""
    from llmc.models.llama.config import get_config
    from llmc.tools import bench_matvec

    out = tmp_path / "r.json"
    assert bench_matvec.main(["--config", "tiny", "--kinds", "fp8,fp8dp", "--rounds", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["kinds"]["fp8dp"]
    assert 0 <= r["check"] < 2e-5, r["check"]
    shapes = bench_matvec.products(get_config("tiny"), get_config("tiny").n_layers, head=True)
    assert r["rounds"][0]["bytes"] == sum(-(-n // 64) * 64 * k for n, k in shapes)


def test_bad_usage_is_one_line_and_exit_2(capsys):
    from llmc.tools import bench_matvec

    with pytest.raises(SystemExit) as e:
        bench_matvec.parse(["--kinds", "fp16"])
    assert e.value.code == 2 and "--kinds fp16: choose from fp8, bf16, int8, fp8dp" in capsys.readouterr().err


def test_a_footprint_over_the_free_memory_is_refused_in_one_line(monkeypatch, capsys):
    from llmc.runtime import weights
    from llmc.tools import bench_matvec

    monkeypatch.setattr(weights, "mem_available", lambda: 1 << 30)  # 1 GiB free; the 8B's fp8 weights are 7.5 GB
    assert bench_matvec.main(["--config", "llama3-8b", "--kinds", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("bench_matvec: llama3-8b x 32 layers is 7.5 GB of fp8 weights, over 70% of the 1.1 GB "
                       "available: give fewer --layers")


def test_no_c_compiler_is_one_line_and_exit_2(monkeypatch, capsys):
    from llmc.tools import bench_matvec

    monkeypatch.setattr(ukernels, "c_compiler", lambda: None)
    assert bench_matvec.main(["--config", "tiny"]) == 2
    assert capsys.readouterr().err.strip() == "bench_matvec: needs x86-64 and a C compiler (the kernels are x86-64 C)"


def test_threads_time_each_round_three_ways_and_their_sums_match(tmp_path, capsys):
    """--threads 2: every round has the plain read, the products with workgroups handed out one at a time and a
    barrier after each product, and the same without barriers; the sums the threads leave (the last product,
    after each way) match the decoded weights, and a channel no thread wrote would read NaN and fail."""
    import math

    from llmc.tools import bench_matvec

    out = tmp_path / "r.json"
    assert bench_matvec.main(["--config", "tiny", "--kinds", "fp8,bf16", "--rounds", "2", "--threads", "2",
                              "--arch", "x86-64-v3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["threads"] == 2
    table = capsys.readouterr().out
    assert "no barriers / read" in table
    for kind in ("fp8", "bf16"):
        r = report["kinds"][kind]
        assert len(r["rounds"]) == 2 and all(s["stream_s"] > 0 and s["kernel_s"] > 0 for s in r["rounds"])
        assert set(r["check_threads"]) == {"claim", "stream"}
        for err in r["check_threads"].values():
            assert not math.isnan(err) and 0 <= err < 1e-5, err
        assert r["stream_ratio"] > 0


def test_worst_check_lets_nan_win():
    from llmc.tools import bench_matvec

    assert bench_matvec.worst_check({"check": 1e-7, "check_threads": {"claim": 3e-7, "stream": 2e-7}}) == 3e-7
    assert math.isnan(bench_matvec.worst_check({"check": 1e-7, "check_threads": {"claim": float("nan"), "stream": 2e-7}}))
    assert bench_matvec.worst_check({"check": 4e-7}) == 4e-7


def test_threads_out_of_range_is_refused(capsys):
    from llmc.tools import bench_matvec

    with pytest.raises(SystemExit) as e:
        bench_matvec.parse(["--threads", "0"])
    assert e.value.code == 2 and "--threads must be 1 to 64" in capsys.readouterr().err
