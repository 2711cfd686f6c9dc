"""tools/bench_tp.py on the tiny Llama: N = 2 against N = 1 from an earlier report (--tokens-from,
the mode for a disk that holds one parameter archive at a time), --iree-flag reaching the build, and
the refusal of a report of another case. Speed is not tested (it is a benchmark)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench_tp.py"
COMMON = ["--config", "tiny", "--threads", "1", "--prompt", "6", "--decode", "4", "--reps", "1", "--warmup", "0"]


def _bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *COMMON, "--out", str(out), *extra], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("tp1"), tmp_path_factory.mktemp("tp2")
    p1 = _bench(one, "--tp", "1")
    assert p1.returncode == 0, p1.stdout[-2000:] + p1.stderr[-3000:]
    # N = 2 in a second run, built with an extra iree-compile flag, its tokens compared with the first run's N = 1.
    p2 = _bench(two, "--tp", "2", "--tokens-from", str(one / "bench_tp.json"), "--iree-flag=--iree-opt-data-tiling=false")
    assert p2.returncode == 0, p2.stdout[-2000:] + p2.stderr[-3000:]
    return one, json.loads((one / "bench_tp.json").read_text()), two, json.loads((two / "bench_tp.json").read_text())


def test_second_run_compares_with_the_first_runs_tokens(reports):
    _, r1, _, r2 = reports
    (run1,), (run2,) = r1["runs"], r2["runs"]
    assert run1["n"] == 1 and run2["n"] == 2 and len(run1["tokens"]) == 4
    # The split module's greedy tokens are the unsplit one's (f32), and the report says they were compared.
    assert run2["tokens"] == run1["tokens"]
    assert run2["tokens_equal"] == "4 of 4"
    assert r2["tokens_from"].endswith("bench_tp.json") and r1["prompt_ids"] == r2["prompt_ids"]


def test_iree_flag_reaches_the_compile(reports):
    _, _, two, r2 = reports
    manifest = json.loads((two / "tp2" / "model.json").read_text())
    flags = manifest["iree_flags"]
    # Passed after llmc's own flags, so it is the one iree-compile keeps.
    assert flags[-1] == "--iree-opt-data-tiling=false" and r2["iree_flags"] == ["--iree-opt-data-tiling=false"]


def test_tokens_are_counted_against_the_reference(reports, tmp_path):
    one, r1, two, _ = reports
    forged = dict(r1, runs=[dict(r1["runs"][0], tokens=[t + 1 for t in r1["runs"][0]["tokens"][:2]] + r1["runs"][0]["tokens"][2:])])
    (tmp_path / "ref.json").write_text(json.dumps(forged))
    out = tmp_path / "again"
    out.mkdir()
    (out / "tp2").symlink_to(two / "tp2")  # --keep reuses the N = 2 build
    proc = _bench(out, "--tp", "2", "--keep", "--tokens-from", str(tmp_path / "ref.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "bench_tp.json").read_text())["runs"][0]["tokens_equal"] == "2 of 4"


def test_report_of_another_case_is_refused(reports, tmp_path):
    one, _, two, _ = reports
    out = tmp_path / "other"
    out.mkdir()
    (out / "tp2").symlink_to(two / "tp2")
    proc = subprocess.run([sys.executable, str(BENCH), *COMMON[:-6], "--decode", "5", "--reps", "1", "--warmup", "0", "--tp", "2",
                           "--keep", "--out", str(out), "--tokens-from", str(one / "bench_tp.json")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1
    assert "--tokens-from" in proc.stderr and "not a report of N = 1" in proc.stderr and "--decode 5" in proc.stderr
