"""tools/bench_tp.py on the tiny Llama: N = 2 against N = 1 from an earlier report (--tokens-from,
the mode for a disk that holds one parameter archive at a time), --iree-flag reaching the build, and
the refusal of a report of another case. Speed is not tested (it is a benchmark).

Two runs, one build each (N = 1, then N = 2 against a copy of the first's report with two tokens
changed): the N = 2 run's own tokens equal N = 1's, and its count against the reference shows it
counted against the file, not against itself."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import main_in_process

COMMON = ["--config", "tiny", "--threads", "1", "--prompt", "6", "--decode", "4", "--reps", "1", "--warmup", "0"]


def _bench(out: Path, *extra: str) -> str:
    """bench_tp.main in this process (a Python with torch costs ~6 s); its builds and worker are
    processes of their own as always. Its stdout."""
    from llmc.tools import bench_tp

    r = main_in_process(bench_tp.main, *COMMON, "--out", out, *extra)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    one, two = tmp_path_factory.mktemp("tp1"), tmp_path_factory.mktemp("tp2")
    _bench(one, "--tp", "1")
    r1 = json.loads((one / "bench_tp.json").read_text())
    # The reference the second run reads: the first run's report with its first two tokens changed.
    forged = dict(r1, runs=[dict(r1["runs"][0], tokens=[t + 1 for t in r1["runs"][0]["tokens"][:2]] + r1["runs"][0]["tokens"][2:])])
    ref = tmp_path_factory.mktemp("ref") / "bench_tp.json"
    ref.write_text(json.dumps(forged))
    # N = 2 in a second run, built with an extra iree-compile flag, its tokens compared with that report's N = 1.
    stdout = _bench(two, "--tp", "2", "--tokens-from", str(ref), "--iree-flag=--iree-opt-data-tiling=false")
    return one, r1, two, json.loads((two / "bench_tp.json").read_text()), stdout


def test_second_run_compares_with_the_first_runs_tokens(reports):
    _, r1, _, r2, _ = reports
    (run1,), (run2,) = r1["runs"], r2["runs"]
    assert run1["n"] == 1 and run2["n"] == 2 and len(run1["tokens"]) == 4
    # The split module's greedy tokens are the unsplit one's (f32), and the report says they were compared.
    assert run2["tokens"] == run1["tokens"]
    assert r2["tokens_from"].endswith("bench_tp.json") and r1["prompt_ids"] == r2["prompt_ids"]


def test_tokens_are_counted_against_the_reference(reports):
    """The reference's first two tokens differ from the run's: 2 of 4 equal (its own N = 2 would give 4 of 4)."""
    _, _, _, r2, stdout = reports
    assert r2["runs"][0]["tokens_equal"] == "2 of 4"
    assert f"tokens compared with N = 1 of {r2['tokens_from']}" in stdout and "| 2 of 4 |" in stdout


def test_iree_flag_reaches_the_compile(reports):
    _, _, two, r2, _ = reports
    manifest = json.loads((two / "tp2" / "model.json").read_text())
    flags = manifest["iree_flags"]
    # Passed after llmc's own flags, so it is the one iree-compile keeps.
    assert flags[-1] == "--iree-opt-data-tiling=false" and r2["iree_flags"] == ["--iree-opt-data-tiling=false"]


def test_report_of_another_case_is_refused(reports):
    """The check main() runs on --tokens-from (the 2-of-4 count above shows it reads the file), called
    directly for each way a report can differ; the real process is test_refusal_comes_before_any_build."""
    from llmc.tools import bench_tp

    one, r1, _, _, _ = reports
    ref = str(one / "bench_tp.json")
    same = bench_tp.parse([*COMMON, "--tp", "2", "--tokens-from", ref])
    assert bench_tp.reference_tokens(same, "tiny", r1["prompt_ids"]) == {1: r1["runs"][0]["tokens"]}
    other = bench_tp.parse([*COMMON[:-6], "--decode", "5", "--reps", "1", "--warmup", "0", "--tp", "2", "--tokens-from", ref])
    with pytest.raises(SystemExit) as e:
        bench_tp.reference_tokens(other, "tiny", r1["prompt_ids"])
    assert isinstance(e.value.code, str)
    assert "--tokens-from" in e.value.code and "not a report of N = 1" in e.value.code and "--decode 5" in e.value.code
    for name, prompt in (("tiny-llama3", r1["prompt_ids"]), ("tiny", r1["prompt_ids"][::-1])):  # another model, another prompt
        with pytest.raises(SystemExit, match="not a report of N = 1"):
            bench_tp.reference_tokens(same, name, prompt)


@pytest.mark.parametrize("case", ["other-decode", "not-a-report"])
def test_refusal_comes_before_any_build(reports, tmp_path, case):
    """`python tools/bench_tp.py ... --tokens-from REPORT` of another case, or of a file that is no report:
    exit 1 with one line naming the flag, before anything is built (nothing written under --out but the
    checkpoint)."""
    one, _, _, _, _ = reports
    ref = one / "bench_tp.json"
    decode = "4"
    if case == "other-decode":
        decode = "5"
    else:
        ref = tmp_path / "notes.txt"
        ref.write_text("not json")
    argv = [*COMMON[:-6], "--decode", decode, "--reps", "1", "--warmup", "0", "--tp", "2", "--tokens-from", str(ref),
            "--out", str(tmp_path / "out")]
    tool = Path(__file__).resolve().parents[2] / "tools" / "bench_tp.py"
    proc = subprocess.run([sys.executable, str(tool), *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"bench_tp: --tokens-from {ref}: ") and "run this bench with --tp 1 first" in line, line
    assert ("--decode 5" in line) if case == "other-decode" else ("cannot read it as a report" in line), line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint"]
