"""tools/bench_gpu.py rehearsed on the CPU: the weight recipe round trip and the run's report.

On a GPU machine the same two halves run with --target cuda; here `prepare --target cpu` compiles
the tiny Llama for llvm-cpu, and `run --torch-device cpu` rebuilds its .irpa from a regenerated
checkpoint and the recipe, runs it, and compares it with eager PyTorch.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_gpu.py"


def _tool(*args, cwd=None):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    r = _tool("prepare", "--target", "cpu", "--only", "tiny-f32", "--out", str(root / "gpu"), "--scratch", str(root / "scratch"))
    assert r.returncode == 0, r.stderr
    return root


def test_recipe_leaves_the_archive_behind_and_names_its_sources(prepared):
    gpu = prepared / "gpu"
    assert not list(gpu.glob("*.irpa")), "a speed case's archive must not travel"
    entries = json.loads((gpu / "tiny-f32.recipe.json").read_text())["entries"]
    manifest = json.loads((gpu / "tiny-f32.json").read_text())
    assert len(entries) == manifest["params"]["count"]
    inline = {e["name"] for e in entries if "inline" in e}
    assert inline == {"rope_cos", "rope_sin"}  # everything else is a checkpoint tensor, byte for byte
    assert all(e["checkpoint"] == e["name"] for e in entries if "checkpoint" in e)


def test_run_rebuilds_the_weights_and_matches_eager(prepared, tmp_path):
    r = _tool("run", "--dir", str(prepared / "gpu"), "--out", str(tmp_path / "out"), "--torch-device", "cpu",
              "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "gpu-bench.json").read_text())
    case = report["cases"]["tiny-f32"]
    assert "error" not in case, case
    # f32 on both sides, same weights: every greedy token equal, logits to f32 rounding.
    assert case["tokens_match"] == 33
    assert case["ref"] in report["refs"] and report["refs"][case["ref"]]["config"] == "tiny"  # ratios taken against its own reference
    assert case["logits_max_abs_err"] <= 1e-4 * case["logits_ref_max_abs"]
    assert case["prefill_ms"] > 0 and case["decode_ms"] > 0
    md = (tmp_path / "out" / "gpu-bench.md").read_text()
    assert "| tiny-f32 (prefill) |" in md and "33/33" in md  # cpu: no buckets by default, the dynamic prefill ran


def test_run_refuses_weights_that_differ_from_the_compiled_ones(prepared, tmp_path):
    gpu = tmp_path / "gpu"
    subprocess.run(["cp", "-r", str(prepared / "gpu"), str(gpu)], check=True)
    recipe = json.loads((gpu / "tiny-f32.recipe.json").read_text())
    victim = next(e for e in recipe["entries"] if "checkpoint" in e)
    victim["sha256"] = "0" * 64
    (gpu / "tiny-f32.recipe.json").write_text(json.dumps(recipe))
    r = _tool("run", "--dir", str(gpu), "--out", str(tmp_path / "out"), "--torch-device", "cpu", "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr  # the run reports per case; one bad case does not end it
    case = json.loads((tmp_path / "out" / "gpu-bench.json").read_text())["cases"]["tiny-f32"]
    assert "differs from the compiled one" in case["error"] and victim["name"] in case["error"]


def test_probe_times_each_decode_entry_alone_and_from_python(tmp_path):
    r = _tool("prepare", "--target", "cpu", "--only", "tiny-f32-static", "--out", str(tmp_path / "gpu"), "--scratch", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    r = _tool("probe", "--dir", str(tmp_path / "gpu"), "--case", "tiny-f32-static", "--out", str(tmp_path / "out"), "--torch-device", "cpu")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "out" / "probe.json").read_text())
    # both entry points ran in iree-benchmark-module (a float, not its error line) and from Python
    assert set(rep["iree_benchmark_module_ms"]) == {"decode_static local-task", "decode local-task"}
    assert all(isinstance(v, float) and v > 0 for v in rep["iree_benchmark_module_ms"].values()), rep
    assert {k.split(":")[0] for k in rep["python_ms"] if ":" in k} == {"decode_static", "decode"}
    assert all(v > 0 for v in rep["python_ms"].values()) and rep["host_copy_equal"] is True
