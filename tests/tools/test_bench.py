"""tools/bench.py end to end on the tiny Llama: fp8 artifacts (with and without prefill buckets, with and
without the cpu matvec kernels) and both eager references at one thread, one round. Checks what the report claims against its own raw samples (medians, ratios,
roofline) and that every output file is written; speed itself is not tested (it is a benchmark)."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(BENCH), "--config", "tiny", "--dtypes", "fp8", "--threads", "1", "--prompt", "8",
                           "--decode", "4", "--reps", "1", "--prefill-buckets", "8", "--kernels", "both", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out, json.loads((out / "bench.json").read_text()), proc.stdout


def test_rows_are_the_medians_of_the_samples_and_ratios_of_the_rows(report):
    _, rep, _ = report
    (run,) = rep["runs"]
    assert run["threads"] == 1 and set(run["samples"]) == {"llmc fp8", "llmc fp8 [buckets 8]", "llmc fp8 [no kernels]",
                                                           "llmc fp8 [buckets 8] [no kernels]", "eager f32", "eager bf16"}
    rows = {(r["phase"], r["engine"]): r for r in rep["rows"]}
    assert set(rows) == {(p, e) for p in ("prefill", "decode") for e in run["samples"]}
    for (phase, engine), r in rows.items():
        samples = run["samples"][engine][phase]
        assert len(samples) == 1 and all(s > 0 for s in samples)
        assert r["tok_s"] == pytest.approx(statistics.median(samples))
        for ref in ("eager f32", "eager bf16"):
            if engine != ref:
                assert r[f"vs {ref}"] == pytest.approx(r["tok_s"] / rows[phase, ref]["tok_s"])


def test_decode_roofline_uses_the_streamed_weight_bytes(report):
    from llmc.models.llama.config import get_config
    from llmc.models.llama.model import init_random

    _, rep, _ = report
    llama = init_random(get_config("tiny"))
    embed = llama.model.embed_tokens.weight.numel()
    assert rep["streamed_parameters"] == sum(p.numel() for p in llama.parameters()) - embed
    bw = rep["runs"][0]["bandwidth_gb_s"]
    assert bw > 0.1
    for r in rep["rows"]:
        if r["phase"] == "decode":
            per_weight = {"fp8": 1, "f32": 4, "bf16": 2}[r["engine"].split()[1]]
            assert r["roofline_tok_s"] == pytest.approx(bw * 1e9 / (rep["streamed_parameters"] * per_weight))
            assert r["pct_roofline"] == pytest.approx(100 * r["tok_s"] / r["roofline_tok_s"])
        else:
            assert "pct_roofline" not in r


def test_table_and_plot_are_written(report):
    out, rep, stdout = report
    table = (out / "bench.md").read_text()
    for r in rep["rows"]:
        assert f"| {r['phase']} | {r['engine']} | 1 | {r['tok_s']:.1f} |" in table
    assert table in stdout  # printed too
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "fp8.vmfb").exists() and (out / "fp8-b8.vmfb").exists() and not list(out.glob("*.tmp"))


def test_the_bucket_build_prefills_with_its_bucket(report):
    """--prefill-buckets builds each dtype twice; the second's rows are timed on its prefill_N entry
    point (the 8-token prompt fills bucket 8), the first's on the dynamic prefill."""
    out, rep, _ = report
    (run,) = rep["runs"]
    assert run["prefill_functions"] == {"llmc fp8": ["prefill"], "llmc fp8 [buckets 8]": ["prefill_8"],
                                        "llmc fp8 [no kernels]": ["prefill"], "llmc fp8 [buckets 8] [no kernels]": ["prefill_8"]}
    buckets = json.loads((out / "fp8-b8.json").read_text())["llm"]["prefill_buckets"]
    assert [b["tokens"] for b in buckets] == [8]


def test_kernels_both_builds_each_narrow_dtype_with_and_without_them(report):
    """--kernels both: the second build of each dtype is compiled with LLMC_CPU_KERNELS=off, which its
    manifest's pass statistics show."""
    out, _, _ = report

    def forms(stem):
        fp8 = next(p for p in json.loads((out / f"{stem}.json").read_text())["passes"] if p["name"] == "fp8-weights")
        return " ".join(fp8["forms"])

    assert "as C kernel calls" in forms("fp8") and "as a reduction" not in forms("fp8")
    assert "as a reduction" in forms("fp8-nokernels") and "C kernel" not in forms("fp8-nokernels")


@pytest.mark.parametrize("args, message", [
    (["--dtypes", "f64"], "unknown dtype"),
    (["--threads", "two"], "--threads"),
    (["--decode", "1"], "--decode >= 2"),
])
def test_bad_usage_exits_2(tmp_path, capsys, args, message):
    """The bench's main() in this process (a Python with torch per case costs ~6 s)."""
    from llmc.tools import bench

    with pytest.raises(SystemExit) as e:
        bench.main([*args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()
