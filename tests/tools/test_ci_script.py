"""tools/ci/llmc-ci.sh (the CI stage) and tools/ci/github-actions.yml (the example workflow).

The script runs for real: `llmc compile` + `llmc diff --junit/--json` on a tiny model's cpu/f32 cell,
a planned cell recorded as skipped (through a wrapper whose table says fp8 is planned), and a model IREE 3.13 can't compile (aten.erfinv) whose
cell fails the run with llmc's exit code 3. The JUnit files the script writes itself come from the
writer `llmc diff --junit` uses (compiler/report.py); junitparser reads them as a CI system would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import yaml
from junitparser import Failure, JUnitXml

from llmc.compiler import report
from llmc.compiler.targets import DTYPES, TARGETS
from llmc.models import zoo

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "ci" / "llmc-ci.sh"
WORKFLOW = REPO / "tools" / "ci" / "github-actions.yml"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_ci(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env or ENV, timeout=900)


def llmc_with_fp8_planned(folder: Path) -> dict:
    """An environment whose $LLMC reports fp8 as planned on every target (as an llmc without the fp8
    passes would), so that the script's skip path runs; every other command is the real llmc."""
    wrapper = folder / "llmc-fp8-planned"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = targets ]; then\n'
        f"  llmc targets --json | {sys.executable} -c 'import json, sys; t = json.load(sys.stdin); "
        '[c["dtypes"]["fp8"].update(state="planned") for c in t.values()]; print(json.dumps(t))\'\n'
        'else exec llmc "$@"; fi\n'
    )
    wrapper.chmod(0o755)
    return {**ENV, "LLMC": str(wrapper)}


def junit_cases(xml_path: Path) -> dict[str, str]:
    """name -> "ok" | "skipped" | "failure" for every testcase in a JUnit file."""
    out = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        state = "ok"
        for tag in ("skipped", "failure", "error"):
            if case.find(tag) is not None:
                state = "failure" if tag == "error" else tag
        out[case.get("name")] = state
    return out


def junit_suite(xml_path: Path):
    """The one testsuite of a cell's JUnit file, read by junitparser (counts checked against the cases)."""
    xml = JUnitXml.fromfile(str(xml_path))
    suites = list(xml)
    assert len(suites) == 1, suites
    suite = suites[0]
    cases = list(suite)
    assert suite.tests == xml.tests == len(cases)
    assert suite.failures == xml.failures == sum(any(isinstance(r, Failure) for r in c.result) for c in cases)
    assert suite.skipped == sum(c.is_skipped for c in cases) and suite.errors == 0
    return suite


@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.pt2"
    model, args, _ = zoo.build("linear_stack")
    torch.export.save(torch.export.export(model, args), str(path))
    return path


def _run_matrix(tmp_path, tiny_pt2, targets: str):
    """The CI script on tiny.pt2 for `targets` x f32,fp8 (fp8 planned: skipped), in tmp_path: (the
    finished process, the reports folder)."""
    (tmp_path / "tiny.pt2").symlink_to(tiny_pt2)
    proc = run_ci("tiny.pt2", "--targets", targets, "--dtypes", "f32,fp8", "--reports", "rep", "--out", "arts", cwd=tmp_path,
                  env=llmc_with_fp8_planned(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, tmp_path / "rep"


def test_ci_runs_the_matrix_and_writes_reports(tmp_path, tiny_pt2):
    """cpu and hip (the vulkan cells are test_ci_runs_the_vulkan_cells_on_lavapipe's: a test on lavapipe
    runs alone under pytest-xdist, so the cells that need no Vulkan driver run beside other tests)."""
    proc, rep = _run_matrix(tmp_path, tiny_pt2, "cpu,hip")

    # cpu/f32 runs here: compiled, then compared by llmc diff, which wrote both reports.
    assert (tmp_path / "arts" / "tiny-cpu-f32" / "tiny.vmfb").stat().st_size > 0
    diff_report = json.loads((rep / "tiny-cpu-f32.json").read_text())
    assert diff_report["passed"] is True and diff_report["target"] == "cpu" and diff_report["dtype"] == "f32"
    cases = junit_cases(rep / "tiny-cpu-f32.xml")
    assert cases and set(cases.values()) == {"ok"}, cases
    assert junit_suite(rep / "tiny-cpu-f32.xml").failures == 0

    # hip compiles here but does not run: the compile is recorded, the run skipped.
    assert (tmp_path / "arts" / "tiny-hip-f32" / "tiny.vmfb").stat().st_size > 0
    assert junit_cases(rep / "tiny-hip-f32.xml") == {"compile": "ok", "diff": "skipped"}
    hip = junit_suite(rep / "tiny-hip-f32.xml")
    assert (hip.name, hip.tests, hip.skipped) == ("tiny-hip-f32", 2, 1)
    assert {p.name: p.value for p in hip.properties()} == {"target": "hip", "dtype": "f32"}
    assert {c.classname for c in hip} == {"llmc.ci.tiny-hip-f32"}

    # fp8 is planned everywhere (as this llmc's table says): recorded as skipped, nothing compiled.
    for target in ("cpu", "hip"):
        assert junit_cases(rep / f"tiny-{target}-fp8.xml") == {"compile": "skipped", "diff": "skipped"}
        assert all(r.message.startswith(f"fp8 on {target} is planned") for c in junit_suite(rep / f"tiny-{target}-fp8.xml") for r in c.result)
        assert not (tmp_path / "arts" / f"tiny-{target}-fp8").exists()

    summary = json.loads((rep / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert [(c["cell"], c["status"]) for c in summary["cells"]] == [
        ("tiny-cpu-f32", "passed"), ("tiny-cpu-fp8", "skipped"), ("tiny-hip-f32", "passed"), ("tiny-hip-fp8", "skipped"),
    ]
    assert "2 passed, 2 skipped" in proc.stdout


@pytest.mark.vulkan_exclusive  # its vulkan cell runs on lavapipe, in the child process the script starts
def test_ci_runs_the_vulkan_cells_on_lavapipe(tmp_path, tiny_pt2):
    from llmc.runtime.device import usable_devices

    proc, rep = _run_matrix(tmp_path, tiny_pt2, "vulkan")

    # vulkan runs where a Vulkan driver is (lavapipe in CI): diffed like cpu; else compile only.
    assert (tmp_path / "arts" / "tiny-vulkan-f32" / "tiny.vmfb").stat().st_size > 0
    if "vulkan" in usable_devices():
        vk = json.loads((rep / "tiny-vulkan-f32.json").read_text())
        assert vk["passed"] is True and vk["target"] == "vulkan"
        assert set(junit_cases(rep / "tiny-vulkan-f32.xml").values()) == {"ok"}
    else:
        assert junit_cases(rep / "tiny-vulkan-f32.xml") == {"compile": "ok", "diff": "skipped"}

    assert junit_cases(rep / "tiny-vulkan-fp8.xml") == {"compile": "skipped", "diff": "skipped"}
    assert all(r.message.startswith("fp8 on vulkan is planned") for c in junit_suite(rep / "tiny-vulkan-fp8.xml") for r in c.result)
    assert not (tmp_path / "arts" / "tiny-vulkan-fp8").exists()
    summary = json.loads((rep / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert [(c["cell"], c["status"]) for c in summary["cells"]] == [("tiny-vulkan-f32", "passed"), ("tiny-vulkan-fp8", "skipped")]
    assert "1 passed, 1 skipped" in proc.stdout


def test_ci_failing_cell_fails_the_run(tmp_path):
    class Probit(torch.nn.Module):
        def forward(self, x):
            return torch.erfinv(torch.tanh(x) * 0.5)

    torch.export.save(torch.export.export(Probit(), (torch.randn(2, 8),)), str(tmp_path / "probit.pt2"))
    proc = run_ci("probit.pt2", "--reports", "rep", "--out", "arts", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # llmc compile's exit code: compiler failure
    rep = tmp_path / "rep"
    assert junit_cases(rep / "probit-cpu-f32.xml") == {"compile": "failure"}
    failure = ET.parse(rep / "probit-cpu-f32.xml").getroot().find(".//failure").get("message")
    assert "failed to legalize operation 'torch.aten.erfinv'" in failure, failure
    suite = junit_suite(rep / "probit-cpu-f32.xml")
    assert (suite.tests, suite.failures) == (1, 1)
    assert [r.message for c in suite for r in c.result] == [failure]
    summary = json.loads((rep / "summary.json").read_text())
    assert summary["exit_code"] == 3 and summary["cells"][0]["status"] == "error"
    # llmc compile left its reproducer in the cell's folder.
    assert list((tmp_path / "arts" / "probit-cpu-f32").glob("llmc-repro-*/input.mlir"))


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "no model given"),
        (["missing.pt2"], "missing.pt2: no such file"),
        (["m.pt2", "--targets", "tpu"], "'tpu' is not an llmc target"),
        (["m.pt2", "--dtypes", "f64"], "'f64' is not an llmc dtype"),
        (["m.pt2", "--frobnicate"], "unknown option --frobnicate"),
    ],
)
def test_ci_bad_usage_exits_2(tmp_path, args, message):
    (tmp_path / "m.pt2").write_bytes(b"unused")
    proc = run_ci(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("llmc-ci: error: "), proc.stderr
    assert not (tmp_path / "reports" / "summary.json").exists()


def test_ci_junit_is_written_by_the_diff_report_writer(tmp_path):
    """The script writes no XML itself: its cells' files come from compiler/report.py, like llmc diff's."""
    script = SCRIPT.read_text()
    assert "-m llmc.compiler.report ci-junit" in script and "<testcase" not in script
    path = tmp_path / "cell.xml"
    message = 'diff exit 3: llmc: error: <weird> & "quoted" \'name\''
    steps = ["compile", "ok", "", "diff", "failure", message, "bisect", "skipped", "not asked for"]
    assert report.main(["ci-junit", str(path), "m-cpu-f32", "cpu", "f32", *steps]) == 0
    suite = junit_suite(path)
    assert (suite.name, suite.tests, suite.failures, suite.skipped) == ("m-cpu-f32", 3, 1, 1)
    assert {p.name: p.value for p in suite.properties()} == {"target": "cpu", "dtype": "f32"}
    results = {c.name: [(type(r).__name__, r.message) for r in c.result] for c in suite}
    assert results == {"compile": [], "diff": [("Failure", message)], "bisect": [("Skipped", "not asked for")]}
    assert path.read_text() == report.ci_cell_junit("m-cpu-f32", "cpu", "f32", [steps[i : i + 3] for i in (0, 3, 6)])
    assert report.main(["ci-junit", str(path), "m-cpu-f32", "cpu", "f32", "compile", "ok"]) == 2  # not triples


def test_ci_needs_a_python_that_imports_llmc(tmp_path):
    (tmp_path / "m.pt2").write_bytes(b"unused")
    fake = tmp_path / "python-without-llmc"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(SCRIPT), "m.pt2"], cwd=tmp_path, capture_output=True, text=True, env={**ENV, "LLMC_CI_PYTHON": str(fake)}, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("llmc-ci: error: ") and "cannot import llmc" in proc.stderr, proc.stderr


def test_workflow_installs_llmc_runs_the_script_and_publishes_junit():
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = [s for job in wf["jobs"].values() for s in job["steps"]]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "pip install -e ." in runs and "tools/ci/llmc-ci.sh" in runs
    uses = {s["uses"].split("@")[0]: s for s in steps if "uses" in s}
    assert "reports/" in uses["actions/upload-artifact"]["with"]["path"]
    assert uses["actions/upload-artifact"]["if"] == "always()"
    junit = uses["mikepenz/action-junit-report"]
    assert junit["with"]["report_paths"] == "reports/*.xml" and junit["if"] == "always()"
    # The matrix names real llmc targets and dtypes, and the reports folder the script writes.
    assert set(wf["env"]["LLMC_CI_TARGETS"].split()) <= set(TARGETS)
    assert set(wf["env"]["LLMC_CI_DTYPES"].split()) <= set(DTYPES)
    assert wf["env"]["LLMC_CI_REPORTS"] == "reports"


def test_hf_checkpoint_folder_is_a_model(tmp_path):
    """An HF checkpoint is a folder, not a file: the script takes it (it used to stop at "no such file").
    A planned dtype keeps the run cheap: the cell is recorded as skipped, named after the folder."""
    from llmc.tools.make_checkpoint import write_checkpoint

    ck = write_checkpoint("tiny", "hf", tmp_path / "tiny-hf", "bf16", 0)  # tools/make_checkpoint.py's default dtype
    proc = run_ci(ck, "--targets", "hip", "--dtypes", "fp8", "--reports", "rep", "--out", "arts", cwd=tmp_path,
                  env=llmc_with_fp8_planned(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert junit_cases(tmp_path / "rep" / "tiny-hf-hip-fp8.xml") == {"compile": "skipped", "diff": "skipped"}
    missing = run_ci(tmp_path / "nope", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr
