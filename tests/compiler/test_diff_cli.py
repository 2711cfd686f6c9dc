"""`llmc diff` end to end: exit codes, the JSON report (validated against report.REPORT_SCHEMA with
jsonschema), the JUnit file (parsed with junitparser), input files, tolerance overrides, logits
checks, compiling first, and bad input (one `llmc: error:` line, exit 2, no files written).

One artifact is compiled from `model.pt2`; "different weights" is `other.pt2` (layer blocks.2
perturbed) diffed against it. Tolerances are the f32 profile of llmc.compiler.diff_metrics.TOLERANCES.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
import torch.nn as nn
from junitparser import JUnitXml

import llmc
from llmc.compiler import cli, diff_inputs, diff_metrics, report

X_SHAPE = (2, 6, 16)


class Block(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """Two outputs: out[0] (logits-like) goes through the blocks, out[1] does not."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(5))
        self.head = nn.Linear(16, 40)
        self.aux = nn.Linear(16, 8)

    def forward(self, x):
        h = x
        for b in self.blocks:
            h = b(h)
        return self.head(h), self.aux(x)


def save_pt2(model: nn.Module, path: Path) -> Path:
    x = torch.randn(*X_SHAPE, generator=torch.Generator().manual_seed(7))
    torch.export.save(torch.export.export(model, (x,)), path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """model.pt2, other.pt2 (blocks.2 weights changed) and art/model.vmfb compiled from model.pt2."""
    d = tmp_path_factory.mktemp("diff")
    torch.manual_seed(0)
    model = Net().eval()
    save_pt2(model, d / "model.pt2")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.blocks[2].parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    save_pt2(model, d / "other.pt2")
    (d / "art").mkdir()
    art = llmc.compile(d / "model.pt2", output=d / "art" / "model.vmfb")
    return {"dir": d, "model": d / "model.pt2", "other": d / "other.pt2", "vmfb": art.vmfb}


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def llmc_diff(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["diff", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def files(*dirs: Path) -> set[Path]:
    return {p for d in dirs for p in d.rglob("*")}


def one_error_line(err: str, *names: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmc: error: "), err
    assert "Traceback" not in err
    for n in names:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def validate(rep: dict) -> None:
    jsonschema.validate(rep, report.REPORT_SCHEMA, format_checker=jsonschema.FormatChecker())


# --- pass / fail, reports -----------------------------------------------------------------------


def test_same_weights_pass(built, work, capsys):
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], "--json", "r.json", "--junit", "r.xml")
    assert code == 0, out + err
    last = out.splitlines()[-1]
    assert last.startswith("PASS: 2 output(s), tolerance profile f32, worst out["), out
    rep = json.loads((work / "r.json").read_text())
    validate(rep)
    assert rep["passed"] is True and rep["format"] == "llmc-diff-report/1"
    outs = rep["entry_points"][0]["outputs"]
    # the summary names the output closest to its limits (both pass; which one depends on the CPU's code)
    assert last.endswith("worst " + max(outs, key=lambda o: (o["severity"], o["max_rel"]))["name"]), out
    assert [o["name"] for o in outs] == ["out[0]", "out[1]"]
    assert [o["shape"] for o in outs] == [[2, 6, 40], [2, 6, 8]]
    for o in outs:
        assert o["passed"] and o["max_rel"] <= 1e-5 and o["cosine"] >= 0.99999, o
    xml = JUnitXml.fromfile(str(work / "r.xml"))
    assert (xml.tests, xml.failures, xml.errors) == (2, 0, 0)
    suites = list(xml)
    assert [s.name for s in suites] == ["main"]
    assert sorted(c.name for c in suites[0]) == ["out[0]", "out[1]"]
    assert all(c.is_passed for c in suites[0])
    # Nothing else written: no temporaries left beside the reports.
    assert sorted(p.name for p in work.iterdir()) == ["r.json", "r.xml"]


def test_fp8_artifact_is_compared_with_both_references(built, work, capsys):
    """--dtype fp8: eager f32 with the original weights (fp8 profile) and eager f32 with the same
    fp8 weights dequantized in PyTorch (the compute dtype's profile, f32 on cpu), both in the report."""
    art = llmc.compile(built["model"], dtype="fp8", output=work / "f8.vmfb")
    code, out, err = llmc_diff(capsys, built["model"], art.vmfb, "--json", "r.json", "--junit", "r.xml")
    assert code == 0, out + err
    rep = json.loads((work / "r.json").read_text())
    validate(rep)
    assert rep["profile"] == "fp8" and rep["same_weights"]["profile"] == "f32"
    assert rep["same_weights"]["weights"] == 12  # 5 blocks x 2 + head + aux
    orig, same = rep["entry_points"]
    assert same["name"] == "main vs same fp8 weights" and orig["passed"] and same["passed"]
    for o, s in zip(orig["outputs"], same["outputs"]):
        assert s["max_rel"] <= 1e-5 and s["max_rel"] < o["max_rel"] / 10, (o, s)
    assert [s.name for s in JUnitXml.fromfile(str(work / "r.xml"))] == ["main", "main vs same fp8 weights"]
    assert "and vs the same fp8 weights (12 dequantized in PyTorch), profile f32" in out.splitlines()[-1]
    # A model the artifact was not compiled from: its weights differ, so the same-weights side fails.
    code, out, _ = llmc_diff(capsys, built["other"], art.vmfb)
    assert code == 1 and out.splitlines()[-1].startswith("FAIL"), out
    assert "same fp8 weights: FAIL out[0]" in out  # both references see the changed block
    # Same inputs and outputs, other parameter names: nothing to dequantize by name; exit 2, one line.
    wrapped = nn.Module()
    wrapped.inner = Net().eval()
    wrapped.forward = lambda x: wrapped.inner(x)
    save_pt2(wrapped, work / "renamed.pt2")
    code, out, err = llmc_diff(capsys, work / "renamed.pt2", art.vmfb)
    assert code == 2, out + err
    one_error_line(err, "f8.irpa: fp8 weight", "is not in the model; diff against the model the artifact was compiled from")


def test_different_weights_fail_and_name_the_worst_output(built, work, capsys):
    code, out, err = llmc_diff(capsys, built["other"], built["vmfb"], "--json", "r.json", "--junit", "r.xml")
    assert code == 1, out + err
    rep = json.loads((work / "r.json").read_text())
    validate(rep)
    o0, o1 = rep["entry_points"][0]["outputs"]
    # out[1] does not go through blocks.2: exact; out[0] does: far over the f32 limit.
    assert o1["passed"] and o1["max_abs"] <= 1e-6
    assert not o0["passed"] and o0["max_rel"] > 1e-2 and "max_rel" in o0["reason"]
    assert rep["passed"] is False
    assert rep["worst"] == {"entry_point": "main", "output": "out[0]", "passed": False, "reason": o0["reason"]}
    assert rep["entry_points"][0]["worst"] == "out[0]"
    last = out.splitlines()[-1]
    assert last.startswith("FAIL: 1 of 2 output(s) over tolerance (profile f32); worst out[0]: max_rel"), last
    assert rep["summary"] == last
    xml = JUnitXml.fromfile(str(work / "r.xml"))
    assert (xml.tests, xml.failures) == (2, 1)
    cases = {c.name: c for c in next(iter(xml))}
    assert cases["out[1]"].is_passed
    (failure,) = cases["out[0]"].result
    assert failure.message == o0["reason"] and failure.type == "ToleranceExceeded"


@pytest.mark.slow  # the same run in-process: test_different_weights_fail_and_name_the_worst_output
def test_real_cli_process_exit_code_and_report(built, work):
    """What a CI job sees: the real `llmc` process, its exit code and its report."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmc.compiler.cli", "diff", str(built["other"]), str(built["vmfb"]), "--junit", "ci.xml"],
        cwd=work, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""
    assert "worst out[0]" in proc.stdout.splitlines()[-1]
    assert JUnitXml.fromfile(str(work / "ci.xml")).failures == 1


def test_broken_reports_fail_the_schema(built, work, capsys):
    code, _, _ = llmc_diff(capsys, built["model"], built["vmfb"], "--json", "r.json", "--logits", "out[0]")
    assert code == 0
    good = json.loads((work / "r.json").read_text())
    validate(good)

    def broken(edit):
        rep = json.loads(json.dumps(good))
        edit(rep)
        return rep

    bad = [
        broken(lambda r: r.pop("format")),
        broken(lambda r: r.update(format="llmc-diff-report/2")),
        broken(lambda r: r.update(passed="yes")),
        broken(lambda r: r["entry_points"][0]["outputs"][0].pop("max_rel")),
        broken(lambda r: r["entry_points"][0]["outputs"][0]["logits"].update(top1=1.5)),
        broken(lambda r: r["tolerance"].update(max_err=1.0)),
        broken(lambda r: r.update(entry_points=[])),
        broken(lambda r: r["inputs"].update(source="stdin")),
    ]
    for rep in bad:
        with pytest.raises(jsonschema.ValidationError):
            validate(rep)


# --- logits -------------------------------------------------------------------------------------


def _independent_logits_metrics(built, x: np.ndarray, k: int) -> tuple[float, float, float]:
    """top-1, top-k overlap and KL(eager || compiled) for out[0], computed here from both models."""
    ref = torch.export.load(str(built["other"])).module()(torch.from_numpy(x))[0].detach().double().reshape(-1, 40).numpy()
    got = llmc.load(built["vmfb"])(torch.from_numpy(x))[0].double().reshape(-1, 40).numpy()
    top1 = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    topk = float(np.mean([len(set(np.argsort(-r)[:k]) & set(np.argsort(-g)[:k])) / k for r, g in zip(ref, got)]))
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = np.exp(got - got.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    kl = float(np.mean(np.sum(p * np.log(p / q), -1)))
    return top1, topk, kl


def test_logits_flag_reports_top1_topk_and_kl(built, work, capsys):
    x = np.random.default_rng(3).standard_normal(X_SHAPE).astype(np.float32)
    np.savez(work / "in.npz", x=x)
    code, out, _ = llmc_diff(capsys, built["other"], built["vmfb"], "--inputs", "in.npz", "--logits", "out[0]", "--top-k", "3", "--json", "r.json")
    assert code == 1
    rep = json.loads((work / "r.json").read_text())
    validate(rep)
    o0, o1 = rep["entry_points"][0]["outputs"]
    top1, topk, kl = _independent_logits_metrics(built, x, 3)
    lg = o0["logits"]
    assert (lg["rows"], lg["k"]) == (12, 3)
    assert lg["top1"] == pytest.approx(top1) and lg["topk"] == pytest.approx(topk)
    assert lg["kl"] == pytest.approx(kl, rel=1e-4)
    assert kl > diff_metrics.TOLERANCES["f32"]["max_kl"] and f"KL {lg['kl']:.3g} > 1e-06" in o0["reason"]
    assert o1["logits"] is None
    assert "top-3" in out


def test_manifest_role_logits_is_checked_without_the_flag(built, work, capsys):
    src = built["vmfb"]
    for suffix in (".vmfb", ".irpa", ".json"):
        shutil.copy(src.with_suffix(suffix), work / f"m{suffix}")
    manifest = json.loads((work / "m.json").read_text())
    manifest["entry_points"]["main"]["outputs"]["children"][1]["role"] = "logits"  # out[1] this time
    (work / "m.json").write_text(json.dumps(manifest))
    code, _, _ = llmc_diff(capsys, built["model"], work / "m.vmfb", "--json", "r.json")
    assert code == 0
    o0, o1 = json.loads((work / "r.json").read_text())["entry_points"][0]["outputs"]
    assert o0["logits"] is None
    assert o1["logits"]["top1"] == 1.0 and o1["logits"]["rows"] == 12 and o1["logits"]["kl"] < 1e-9


def test_logits_unknown_output(built, work, capsys):
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], "--logits", "logits", "--json", "r.json")
    assert code == 2 and out == ""
    one_error_line(err, "--logits logits", "out[0], out[1]")
    assert list(work.iterdir()) == []


# --- tolerance overrides ------------------------------------------------------------------------


def test_tolerance_override_applies_to_this_run(built, work, capsys):
    loose = "max_rel=10,min_cosine=-1,min_top1=0,max_kl=1e9"
    code, out, _ = llmc_diff(capsys, built["other"], built["vmfb"], "--tolerance", loose, "--logits", "out[0]", "--json", "r.json")
    assert code == 0, out
    rep = json.loads((work / "r.json").read_text())
    assert rep["tolerance"] == {"max_rel": 10.0, "min_cosine": -1.0, "min_top1": 0.0, "max_kl": 1e9}
    assert rep["tolerance_overrides"] == rep["tolerance"]
    # Tightening one key only: the profile's other limits stay, and same weights now fail on it.
    code, out, _ = llmc_diff(capsys, built["model"], built["vmfb"], "--tolerance", "max_rel=0", "--json", "r.json")
    rep = json.loads((work / "r.json").read_text())
    assert rep["tolerance"]["min_cosine"] == diff_metrics.TOLERANCES["f32"]["min_cosine"]
    nonzero = [o for o in rep["entry_points"][0]["outputs"] if o["max_rel"] > 0]
    assert nonzero, "f32 reorderings give some nonzero error"
    assert code == 1 and all(not o["passed"] for o in nonzero)


def test_tolerance_unknown_key(built, work, capsys):
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], "--tolerance", "max_rel=1e-4,atol=1", "--json", "r.json")
    assert code == 2 and out == ""
    one_error_line(err, "--tolerance", "'atol'", "max_rel, min_cosine, min_top1, max_kl")
    assert list(work.iterdir()) == []


# --- input files --------------------------------------------------------------------------------


def test_inputs_file_is_what_runs(built, work, capsys):
    entry = llmc.load(built["vmfb"]).manifest["entry_points"]["main"]
    (x,), _ = diff_inputs.random_inputs(entry, 0, 16)
    np.savez(work / "same.npz", x=x.numpy())  # the seed-0 inputs, by name
    np.savez(work / "path.npz", **{"[0][0]": x.numpy()})  # the same, by signature path
    np.savez(work / "other.npz", x=(x * 3).numpy())
    runs = {}
    for name in ("seed", "same", "path", "other"):
        extra = [] if name == "seed" else ["--inputs", f"{name}.npz"]
        code, _, _ = llmc_diff(capsys, built["other"], built["vmfb"], *extra, "--json", f"{name}.json")
        assert code == 1
        runs[name] = json.loads((work / f"{name}.json").read_text())
    max_abs = {k: r["entry_points"][0]["outputs"][0]["max_abs"] for k, r in runs.items()}
    assert max_abs["same"] == max_abs["seed"] == max_abs["path"]
    assert max_abs["other"] != max_abs["seed"]
    assert runs["same"]["inputs"] == {"source": "file", "seed": None, "file": "same.npz"}
    assert runs["seed"]["inputs"] == {"source": "random", "seed": 0, "file": None}


@pytest.mark.parametrize(
    "arrays,names",
    [
        ({}, ["missing", "x ([0][0])"]),
        ({"x": np.zeros(X_SHAPE, np.float32), "y": np.zeros(3, np.float32)}, ["unexpected", "'y'"]),
        ({"x": np.zeros((2, 7, 16), np.float32)}, ["'x'", "[2, 7, 16]", "[2, 6, 16]"]),
        ({"x": np.zeros(X_SHAPE, np.float16)}, ["'x'", "float16", "float32"]),
    ],
    ids=["missing", "extra", "shape", "dtype"],
)
def test_inputs_file_errors(built, work, capsys, arrays, names):
    np.savez(work / "in.npz", **arrays)
    before = files(work, built["dir"])
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], "--inputs", "in.npz", "--json", "r.json", "--junit", "r.xml")
    assert code == 2 and out == ""
    one_error_line(err, "--inputs in.npz", *names)
    assert files(work, built["dir"]) == before


def test_inputs_not_npz_and_missing(built, work, capsys):
    (work / "in.npz").write_text("x = 1\n")
    code, _, err = llmc_diff(capsys, built["model"], built["vmfb"], "--inputs", "in.npz")
    assert code == 2
    one_error_line(err, "--inputs in.npz", "not an .npz")
    code, _, err = llmc_diff(capsys, built["model"], built["vmfb"], "--inputs", "gone.npz")
    assert code == 2
    one_error_line(err, "--inputs gone.npz", "no such file")


# --- compiling first ----------------------------------------------------------------------------


@pytest.mark.slow  # compiling first: test_compile_first_into_temp_leaves_nothing; -o is compile_model's
def test_compile_first_into_output(built, work, capsys):
    (work / "out").mkdir()
    code, out, err = llmc_diff(capsys, built["model"], "--target", "cpu", "--dtype", "f32", "-o", "out/m.vmfb", "--json", "r.json")
    assert code == 0, out + err
    assert sorted(p.name for p in (work / "out").iterdir()) == ["m.irpa", "m.json", "m.vmfb"]
    rep = json.loads((work / "r.json").read_text())
    validate(rep)
    assert rep["compiled_by_diff"] is True and rep["artifact"] == "out/m.vmfb"
    assert llmc.load(work / "out" / "m.vmfb").manifest["dtype"] == "f32"


def test_compile_first_into_temp_leaves_nothing(built, work, capsys, monkeypatch):
    import tempfile

    scratch = work / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where diff's temp dir goes
    before = files(work, built["dir"])
    code, out, err = llmc_diff(capsys, built["other"], "--dtype", "f32")
    assert code == 0, out + err  # other.pt2 compiled, and compared with itself
    assert out.splitlines()[-1].startswith("PASS: 2 output(s)")
    assert files(work, built["dir"]) == before
    assert list(scratch.iterdir()) == []


def test_compile_first_checks_the_inputs_file_before_compiling(built, work, capsys):
    np.savez(work / "in.npz", x=np.zeros((2, 6, 15), np.float32))
    before = files(work, built["dir"])
    code, out, err = llmc_diff(capsys, built["model"], "-o", "m.vmfb", "--inputs", "in.npz")
    assert code == 2 and out == ""
    one_error_line(err, "--inputs in.npz", "'x'", "[2, 6, 15]")
    assert files(work, built["dir"]) == before  # no m.vmfb / m.irpa / m.json


def test_artifact_with_conflicting_flags(built, work, capsys):
    code, _, err = llmc_diff(capsys, built["model"], built["vmfb"], "--dtype", "bf16")
    assert code == 2
    one_error_line(err, "--dtype=bf16", "--dtype=f32")
    code, _, err = llmc_diff(capsys, built["model"], built["vmfb"], "-o", "x.vmfb")
    assert code == 2
    one_error_line(err, "-o x.vmfb")
    assert list(work.iterdir()) == []


def test_bad_compile_flags_fail_before_any_work(built, work, capsys):
    code, _, err = llmc_diff(capsys, built["model"], "--target", "tpu", "--json", "r.json")
    assert code == 2
    one_error_line(err, "--target", "tpu")
    assert list(work.iterdir()) == []


def test_report_folder_missing(built, work, capsys):
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], "--junit", "nodir/r.xml")
    assert code == 2 and out == ""
    one_error_line(err, "--junit nodir/r.xml", "does not exist")
    assert list(work.iterdir()) == []


# --- crash: exit 3 ------------------------------------------------------------------------------


def test_compile_failure_exits_3_with_a_reproducer(built, work, capsys):
    """--per-layer compiles with the artifact's recorded IREE flags; a flag iree-compile rejects is a crash."""
    src = built["vmfb"]
    for suffix in (".vmfb", ".irpa", ".json"):
        shutil.copy(src.with_suffix(suffix), work / f"m{suffix}")
    manifest = json.loads((work / "m.json").read_text())
    manifest["iree_flags"].append("--iree-no-such-flag=1")
    (work / "m.json").write_text(json.dumps(manifest))
    code, out, err = llmc_diff(capsys, built["model"], work / "m.vmfb", "--per-layer", "--repro-dir", "repro", "--json", "r.json")
    assert code == 3
    assert err.startswith("llmc: error: iree-compile exited with code") and "no-such-flag" in err, err
    (saved,) = (work / "repro").iterdir()
    assert sorted(p.name for p in saved.iterdir()) == ["command.sh", "input.mlir", "stderr.txt"]
    assert not (work / "r.json").exists()


@pytest.mark.parametrize(
    "extra, names",
    [
        (("--top-k", "0"), ("--top-k 0", "at least 1")),
        (("--per-layer-depth", "0"), ("--per-layer-depth 0", "at least 1")),
        (("--tolerance-profile", "f8"), ("--tolerance-profile=f8", "auto")),
    ],
)
def test_option_range_errors(built, work, capsys, extra, names):
    before = files(work)
    code, out, err = llmc_diff(capsys, built["model"], built["vmfb"], *extra, "--json", "r.json")
    assert code == 2 and out == ""
    one_error_line(err, *names)
    assert files(work) == before  # no report written


def test_artifact_of_another_model(built, work, capsys):
    """An artifact whose input differs from the model's: exit 2 naming the input, nothing run."""
    other = work / "emb.pt2"
    torch.export.save(torch.export.export(nn.Embedding(10, 16), (torch.zeros(2, 6, dtype=torch.int64),)), other)
    code, _, err = llmc_diff(capsys, other, built["vmfb"])
    assert code == 2
    one_error_line(err, "diff the artifact against the model it was compiled from")


def test_same_weights_failure_alone_fails_the_verdict():
    """The second fp8 reference decides the verdict when the first passes (report.SameWeights)."""
    tol = diff_metrics.TOLERANCES["f32"]
    ref = torch.linspace(1, 2, 8)
    same = report.SameWeights([diff_metrics.compare("out", ref * 1.01, ref, tol)], "f32", tol, 3, 0.5)
    assert not same.passed
    verdict = same.summary("PASS: 1 output(s), tolerance profile fp8", True)
    assert verdict.startswith("FAIL: vs eager with the same fp8 weights (profile f32), worst out: max_rel"), verdict
    assert same.summary("FAIL: 1 of 1 output(s)", False) == "FAIL: 1 of 1 output(s)"  # the first failure is named first
    entry = same.entry("main")
    assert entry["name"] == "main vs same fp8 weights" and entry["passed"] is False
    assert same.record() == {"profile": "f32", "tolerance": tol, "weights": 3}
    assert same.line().startswith("vs eager with the same fp8 weights (3 dequantized in PyTorch, profile f32): FAIL, worst out")
