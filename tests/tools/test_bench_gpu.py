"""tools/bench_gpu.py rehearsed on the CPU: the weight recipe round trip and the run's report.

On a GPU machine the same two halves run with --target cuda; here `prepare --target cpu` compiles
the tiny Llama for llvm-cpu, and `run --torch-device cpu` rebuilds its .irpa from a regenerated
checkpoint and the recipe, runs it, and compares it with eager PyTorch. One case is compiled, once, for
every test: tiny-f32-static (the plan's tiny-f32 with --static-decode on), whose decode_static entry
point the probe needs besides decode; run and the recipe take it as they take any case. One run serves
the run's tests: the good case and, before it, a copy whose recipe does not match its weights.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_gpu.py"
CASE = "tiny-f32-static"
TAMPERED = "tiny-f32-static-tampered"


def _tool(*args, cwd=None):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    r = _tool("prepare", "--target", "cpu", "--only", CASE, "--out", str(root / "gpu"), "--scratch", str(root / "scratch"))
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def ran(prepared, tmp_path_factory):
    """`run` over the prepared folder plus TAMPERED, CASE's files with one recipe entry's sha256 changed,
    planned first (the same model: both share one PyTorch reference). Its report and Markdown."""
    root = tmp_path_factory.mktemp("run")
    gpu = root / "gpu"
    shutil.copytree(prepared / "gpu", gpu)
    for f in list(gpu.glob(f"{CASE}.*")):
        shutil.copyfile(f, gpu / f.name.replace(CASE, TAMPERED, 1))
    recipe = json.loads((gpu / f"{TAMPERED}.recipe.json").read_text())
    victim = next(e for e in recipe["entries"] if "checkpoint" in e)
    victim["sha256"] = "0" * 64
    (gpu / f"{TAMPERED}.recipe.json").write_text(json.dumps(recipe))
    plan = json.loads((gpu / "plan.json").read_text())
    (case,) = plan
    (gpu / "plan.json").write_text(json.dumps([dict(case, name=TAMPERED), case]))
    r = _tool("run", "--dir", str(gpu), "--out", str(root / "out"), "--torch-device", "cpu", "--work", str(root / "work"))
    assert r.returncode == 0, r.stderr  # the run reports per case; one bad case does not end it
    return json.loads((root / "out" / "gpu-bench.json").read_text()), (root / "out" / "gpu-bench.md").read_text(), victim["name"]


def test_recipe_leaves_the_archive_behind_and_names_its_sources(prepared):
    gpu = prepared / "gpu"
    assert not list(gpu.glob("*.irpa")), "a speed case's archive must not travel"
    entries = json.loads((gpu / f"{CASE}.recipe.json").read_text())["entries"]
    manifest = json.loads((gpu / f"{CASE}.json").read_text())
    assert len(entries) == manifest["params"]["count"]
    inline = {e["name"] for e in entries if "inline" in e}
    assert inline == {"rope_cos", "rope_sin"}  # everything else is a checkpoint tensor, byte for byte
    assert all(e["checkpoint"] == e["name"] for e in entries if "checkpoint" in e)
    # cpu f32 with a prefill chunk where llmc's f32 kernel serves: linear weights in 16-channel panels
    packed = {p["name"]: p for p in manifest["passes"]}.get("f32-gemm-weights", {}).get("rewrote", 0)
    laid = {e["name"] for e in entries if e.get("layout") == "panels16"}
    linear = {e["name"] for e in entries if e["name"].endswith("_proj.weight")}
    assert (laid and linear <= laid <= linear | {"lm_head.weight"}) if packed else not laid, (packed, laid)


def test_run_rebuilds_the_weights_and_matches_eager(ran):
    """Rebuilt from a checkpoint the run regenerated in its own --work folder."""
    report, md, _ = ran
    case = report["cases"][CASE]
    assert "error" not in case, case
    # f32 on both sides, same weights: every greedy token equal, logits to f32 rounding.
    assert case["tokens_match"] == 33
    assert case["ref"] in report["refs"] and report["refs"][case["ref"]]["config"] == "tiny"  # ratios taken against its own reference
    assert case["logits_max_abs_err"] <= 1e-4 * case["logits_ref_max_abs"]
    assert case["prefill_ms"] > 0 and case["decode_ms"] > 0
    # cpu: no buckets by default; the prompt is a whole number of --prefill-chunk auto's 64-token chunks
    assert f"| {CASE} (prefill_chunk) |" in md and "33/33" in md


def test_run_refuses_weights_that_differ_from_the_compiled_ones(ran):
    report, md, victim = ran
    case = report["cases"][TAMPERED]
    assert "differs from the compiled one" in case["error"] and victim in case["error"]
    assert list(report["cases"]) == [TAMPERED, CASE]  # the good case ran after it
    assert f"| {TAMPERED} | " in md


def test_probe_times_each_decode_entry_alone_and_from_python(prepared, tmp_path):
    """--work holds the checkpoint prepare compiled against (make_checkpoint is deterministic: what probe
    would write there again; test_run_rebuilds_the_weights_and_matches_eager regenerates it): the
    recipe's rebuild still runs."""
    ckpt = next((prepared / "scratch").glob("ckpt-*"))
    shutil.copytree(ckpt, tmp_path / "work" / ckpt.name)
    r = _tool("probe", "--dir", str(prepared / "gpu"), "--case", CASE, "--out", str(tmp_path / "out"), "--torch-device", "cpu",
              "--work", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "out" / "probe.json").read_text())
    # both entry points ran in iree-benchmark-module (a float, not its error line) and from Python
    assert set(rep["iree_benchmark_module_ms"]) == {"decode_static local-task", "decode local-task"}
    assert all(isinstance(v, float) and v > 0 for v in rep["iree_benchmark_module_ms"].values()), rep
    assert {k.split(":")[0] for k in rep["python_ms"] if ":" in k} == {"decode_static", "decode"}
    assert all(v > 0 for v in rep["python_ms"].values()) and rep["host_copy_equal"] is True


def test_a_recipe_with_an_unknown_layout_is_refused_before_any_work(tmp_path):
    """A recipe from another llmc version: one clear error naming the entry, before a checkpoint is regenerated."""
    from llmc.tools import bench_gpu

    (tmp_path / "c.recipe.json").write_text(json.dumps({"entries": [
        {"name": "w", "sha256": "0" * 64, "nbytes": 4, "checkpoint": "w", "layout": "panels32"}]}))
    with pytest.raises(RuntimeError) as e:
        bench_gpu.rebuild_archive({"name": "c", "config": "tiny", "ckpt_dtype": "f32"}, tmp_path, tmp_path / "work")
    assert str(e.value) == ("c: entry w: unknown layout 'panels32' (known: panels16); "
                            "prepare and run come from different llmc versions")
    assert not (tmp_path / "work").exists()
