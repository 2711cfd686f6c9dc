"""tools/bench.py end to end on the tiny Llama: fp8 artifacts (with and without prefill buckets, with and
without the cpu matvec kernels) and both eager references at one thread, one round. Checks what the report claims against its own raw samples (medians, ratios,
roofline) and that every output file is written; speed itself is not tested (it is a benchmark).

Two runs, three compiles (each ~15-40 s): `--kernels both` builds fp8 with and without the kernels; a second
run, `--prefill-buckets 8 --kernels off --keep`, reuses the first's build without kernels and compiles only
the bucket build without them (the names of both options together). One run with both options would
compile their cross product, four builds."""

import json
import statistics
from pathlib import Path

import pytest
from conftest import main_in_process

COMMON = ["--config", "tiny", "--dtypes", "fp8", "--threads", "1", "--prompt", "8", "--decode", "4", "--reps", "1"]


def _bench(out: Path, *extra: str):
    """bench.main in this process (its compiles are llmc.compile calls either way; a Python with torch
    costs ~6 s), its worker a process of its own as always: (out, report, stdout)."""
    from llmc.tools import bench

    r = main_in_process(bench.main, *COMMON, "--out", out, *extra)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out, json.loads((out / "bench.json").read_text()), r.stdout


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    kernels = _bench(tmp_path_factory.mktemp("bench"), "--kernels", "both")
    out = tmp_path_factory.mktemp("buckets")
    for suffix in (".vmfb", ".irpa", ".json"):  # --keep reuses the first run's build without kernels
        (out / f"fp8-nokernels{suffix}").symlink_to(kernels[0] / f"fp8-nokernels{suffix}")
    buckets = _bench(out, "--prefill-buckets", "8", "--kernels", "off", "--keep")
    return {"kernels": kernels, "buckets": buckets}


ENGINES = {"kernels": {"llmc fp8", "llmc fp8 [no kernels]"},
           "buckets": {"llmc fp8 [no kernels]", "llmc fp8 [buckets 8] [no kernels]"}}


@pytest.mark.parametrize("which", ["kernels", "buckets"])
def test_rows_are_the_medians_of_the_samples_and_ratios_of_the_rows(reports, which):
    _, rep, _ = reports[which]
    (run,) = rep["runs"]
    assert run["threads"] == 1 and set(run["samples"]) == ENGINES[which] | {"eager f32", "eager bf16"}
    rows = {(r["phase"], r["engine"]): r for r in rep["rows"]}
    assert set(rows) == {(p, e) for p in ("prefill", "decode") for e in run["samples"]}
    for (phase, engine), r in rows.items():
        samples = run["samples"][engine][phase]
        assert len(samples) == 1 and all(s > 0 for s in samples)
        assert r["tok_s"] == pytest.approx(statistics.median(samples))
        for ref in ("eager f32", "eager bf16"):
            if engine != ref:
                assert r[f"vs {ref}"] == pytest.approx(r["tok_s"] / rows[phase, ref]["tok_s"])


@pytest.mark.parametrize("which", ["kernels", "buckets"])
def test_decode_roofline_uses_the_streamed_weight_bytes(reports, which):
    from llmc.models.llama.config import get_config
    from llmc.models.llama.model import init_random

    _, rep, _ = reports[which]
    llama = init_random(get_config("tiny"))
    embed = llama.model.embed_tokens.weight.numel()
    assert rep["streamed_parameters"] == sum(p.numel() for p in llama.parameters()) - embed
    bw = rep["runs"][0]["bandwidth_gb_s"]
    assert bw > 0.1
    # the roofline's bandwidth is the median of the figures measured in each timed round
    assert len(rep["runs"][0]["bandwidth_samples"]) == rep["reps"]
    assert bw == pytest.approx(statistics.median(rep["runs"][0]["bandwidth_samples"]))
    # read from 2 MB pages; the same read from 4 KB pages is kept beside it, one per round
    assert len(rep["runs"][0]["bandwidth_4k_samples"]) == rep["reps"] and min(rep["runs"][0]["bandwidth_4k_samples"]) > 0.1
    for r in rep["rows"]:
        if r["phase"] == "decode":
            per_weight = {"fp8": 1, "f32": 4, "bf16": 2}[r["engine"].split()[1]]
            assert r["roofline_tok_s"] == pytest.approx(bw * 1e9 / (rep["streamed_parameters"] * per_weight))
            assert r["pct_roofline"] == pytest.approx(100 * r["tok_s"] / r["roofline_tok_s"])
            # each round's decode against the read taken in that round
            samples = rep["runs"][0]["samples"][r["engine"]]["decode"]
            assert len(r["pct_roofline_rounds"]) == rep["reps"] == len(samples)
            for pct, tok_s, round_bw in zip(r["pct_roofline_rounds"], samples, rep["runs"][0]["bandwidth_samples"]):
                assert pct == pytest.approx(100 * tok_s * rep["streamed_parameters"] * per_weight / (round_bw * 1e9))
        else:
            assert "pct_roofline" not in r and "pct_roofline_rounds" not in r


@pytest.mark.parametrize("which, builds", [("kernels", ["fp8", "fp8-nokernels"]), ("buckets", ["fp8-b8-nokernels"])])
def test_table_and_plot_are_written(reports, which, builds):
    out, rep, stdout = reports[which]
    table = (out / "bench.md").read_text()
    for r in rep["rows"]:
        assert f"| {r['phase']} | {r['engine']} | 1 | {r['tok_s']:.1f} |" in table
    assert table in stdout  # printed too
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all((out / f"{b}.vmfb").exists() for b in builds) and not list(out.glob("*.tmp"))


def test_the_bucket_build_prefills_with_its_bucket(reports):
    """--prefill-buckets builds each dtype twice; the second's rows are timed on its prefill_N entry
    point (the 8-token prompt fills bucket 8), the first's on the dynamic prefill. With --kernels off
    both builds are the ones without kernels, named so; --keep compiled only the build not already there."""
    out, rep, _ = reports["buckets"]
    (run,) = rep["runs"]
    assert run["prefill_functions"] == {"llmc fp8 [no kernels]": ["prefill"], "llmc fp8 [buckets 8] [no kernels]": ["prefill_8"]}
    assert list(rep["compile_seconds"]) == ["fp8 [buckets 8] [no kernels]"]
    buckets = json.loads((out / "fp8-b8-nokernels.json").read_text())["llm"]["prefill_buckets"]
    assert [b["tokens"] for b in buckets] == [8]
    assert not (out / "fp8.vmfb").exists() and not (out / "fp8-b8.vmfb").exists()  # --kernels off: no build with kernels


def test_kernels_both_builds_each_narrow_dtype_with_and_without_them(reports):
    """--kernels both: the second build of each dtype is compiled with LLMC_CPU_KERNELS=off, which its
    manifest's pass statistics show (so does the bucket build of --kernels off)."""
    out, rep, _ = reports["kernels"]
    assert set(rep["compile_seconds"]) == {"fp8", "fp8 [no kernels]"}
    assert rep["runs"][0]["prefill_functions"] == {"llmc fp8": ["prefill"], "llmc fp8 [no kernels]": ["prefill"]}

    def forms(path):
        fp8 = next(p for p in json.loads(path.read_text())["passes"] if p["name"] == "fp8-weights")
        return " ".join(fp8["forms"])

    assert "as C kernel calls" in forms(out / "fp8.json") and "as a reduction" not in forms(out / "fp8.json")
    for off in (out / "fp8-nokernels.json", reports["buckets"][0] / "fp8-b8-nokernels.json"):
        assert "as a reduction" in forms(off) and "C kernel" not in forms(off)


@pytest.mark.parametrize("args, message", [
    (["--dtypes", "f64"], "unknown dtype"),
    (["--threads", "two"], "--threads"),
    (["--decode", "1"], "--decode >= 2"),
    (["--config", "tiny", "--prompt", "4000"], "give a shorter --prompt or --decode"),
])
def test_bad_usage_exits_2(tmp_path, capsys, args, message):
    """The bench's main() in this process (a Python with torch per case costs ~6 s)."""
    from llmc.tools import bench

    with pytest.raises(SystemExit) as e:
        bench.main([*args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_plan_builds_adds_a_second_build_per_option():
    """--prefill-buckets, --prefill-chunk and --kv-dtype each add a build of every dtype with that option
    (several: their cross product), named in the row key and the file stem; --kernels both doubles the
    dtypes llmc has C kernels for (narrow weights, and f32's prefill chunks), not f16."""
    from llmc.tools import bench

    plan = lambda *a: {key: (stem, options, kern) for key, stem, _, _, options, kern in bench.plan_builds(bench.parse(list(a)))}
    default = {"prefill_buckets": "auto", "prefill_chunk": "auto", "kv_dtype": "auto"}
    builds = plan("--dtypes", "f32", "--prefill-chunk", "none")
    assert builds == {"f32": ("f32", default, True),
                      "f32 [chunk none]": ("f32-cnone", {**default, "prefill_chunk": "none"}, True)}
    builds = plan("--dtypes", "f32,fp8", "--prefill-buckets", "128", "--prefill-chunk", "32", "--kernels", "both")
    assert len(builds) == 8 + 8
    assert builds["f32 [chunk 32] [no kernels]"] == ("f32-c32-nokernels", {**default, "prefill_chunk": "32"}, False)
    assert len(plan("--dtypes", "f16", "--kernels", "both")) == 1
    assert builds["fp8 [buckets 128] [chunk 32] [no kernels]"] == (
        "fp8-b128-c32-nokernels", {**default, "prefill_buckets": "128", "prefill_chunk": "32"}, False)
    assert builds["f32 [chunk 32]"][1] == {**default, "prefill_chunk": "32"}
    builds = plan("--dtypes", "bf16,fp8", "--kv-dtype", "bf16")
    assert builds["bf16 [kv bf16]"] == ("bf16-kvbf16", {**default, "kv_dtype": "bf16"}, True)
    assert set(builds) == {"bf16", "bf16 [kv bf16]", "fp8", "fp8 [kv bf16]"}


def test_roofline_buffer_is_read_from_huge_pages_and_the_other_from_small_ones():
    """The roofline's 256 MiB sit in 2 MB pages (as llmc's weights do), the 4 KB figure's in 4 KB pages;
    both sums read every element (the figure is bytes over time, so a short sum would inflate it)."""
    from llmc.runtime import weights
    from llmc.tools import bench

    if weights.transparent_huge_pages() != "madvise":
        pytest.skip("the kernel's THP mode is not madvise")
    for huge in (True, False):
        buf = bench.ReadBuffer(huge=huge)
        at = buf.tensor.data_ptr()
        in_huge = next(m[3] for m in weights.anonymous_mappings() if m[0] <= at < m[1])
        if huge:
            assert in_huge >= 200 << 20, in_huge
        else:
            assert in_huge == 0
        assert float(buf.tensor.sum()) == buf.SIZE // 4
        assert buf.gb_s(1) > 0.1
        del buf
