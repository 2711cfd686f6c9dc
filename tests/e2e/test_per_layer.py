"""`llmc diff --per-layer`: the first module whose output goes over tolerance is named.

Acceptance: an artifact built from a copy of the model whose layer `blocks.2` has different
weights, diffed against the unperturbed .pt2, names `blocks.2` (its first sub-module at full depth,
the block itself at depth 1) with its source line; a clean artifact names none. The instrumented
module runs with the artifact's own .irpa, which is what makes the changed weights show up.
Tolerances: the f32 profile of llmc.compiler.diff_metrics.TOLERANCES (max_rel 1e-5, cosine 0.99999).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn as nn

import llmc
from llmc.compiler import cli, report

X_SHAPE = (2, 6, 16)


class Block(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)

    def forward(self, x):
        h = self.act(self.fc1(x))  # FC1-LINE
        return x + self.fc2(h)  # BLOCK-OUT-LINE


class Net(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.blocks = nn.ModuleList(Block(16, hidden) for _ in range(5))
        self.head = nn.Linear(16, 40)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _line(tag: str) -> str:
    lines, start = inspect.getsourcelines(Block.forward)
    return f"{__file__}:{start + next(i for i, l in enumerate(lines) if tag in l)}"


def _export(model: nn.Module, path: Path) -> Path:
    x = torch.randn(*X_SHAPE, generator=torch.Generator().manual_seed(7))
    torch.export.save(torch.export.export(model, (x,)), path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("per_layer")
    torch.manual_seed(0)
    model = Net().eval()
    _export(model, d / "model.pt2")
    # The same model with exactly one layer's weights changed, compiled into the artifact.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.blocks[2].parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    _export(model, d / "perturbed.pt2")
    perturbed = llmc.compile(d / "perturbed.pt2", output=d / "perturbed.vmfb")
    return {"dir": d, "model": d / "model.pt2", "perturbed.pt2": d / "perturbed.pt2", "perturbed": perturbed.vmfb}


def per_layer_run(capsys, tmp_path, *argv) -> tuple[int, str, dict]:
    rep_path = tmp_path / "r.json"
    code = cli.main(["diff", *map(str, argv), "--json", str(rep_path)])
    out = capsys.readouterr().out
    rep = json.loads(rep_path.read_text())
    jsonschema.validate(rep, report.REPORT_SCHEMA)
    return code, out, rep["entry_points"][0]["per_layer"]


def test_perturbed_layer_is_named_first(built, tmp_path, capsys):
    code, out, pl = per_layer_run(capsys, tmp_path, built["model"], built["perturbed"], "--per-layer")
    assert code == 1, out
    modules = {m["module"]: m for m in pl["modules"]}
    assert len(modules) == 5 * 4 + 1  # fc1, act, fc2 and the block itself per block, then head
    first = pl["first_divergence"]
    assert first["module"] == "blocks.2.fc1", first
    assert first["type"].endswith("Linear") and first["level"] == 2
    assert first["source"] == _line("FC1-LINE") and "self.fc1(x)" in first["code"]
    # Everything computed before blocks.2 matches eager at f32 precision ...
    order = [m["module"] for m in pl["modules"]]
    before = order[: order.index("blocks.2.fc1")]
    assert before == [f"blocks.{i}{s}" for i in range(2) for s in (".fc1", ".act", ".fc2", "")]
    for name in before:
        assert modules[name]["passed"] and modules[name]["max_rel"] <= 1e-5, modules[name]
    # ... and the change propagates through everything after it.
    for name in ("blocks.2.fc1", "blocks.2", "blocks.3", "blocks.4", "head"):
        assert not modules[name]["passed"] and modules[name]["max_rel"] > 1e-3, modules[name]
    assert pl["params"] == str(built["perturbed"].with_suffix(".irpa").resolve())
    assert "per-layer: first divergence: blocks.2.fc1 (Linear)" in out
    assert out.splitlines()[-1].endswith("first divergent module: blocks.2.fc1")


@pytest.mark.slow  # depth selection itself: tests/compiler/test_diff.py::test_select_probes_depth_one
def test_perturbed_layer_at_depth_one(built, tmp_path, capsys):
    code, out, pl = per_layer_run(capsys, tmp_path, built["model"], built["perturbed"], "--per-layer-depth", "1")
    assert code == 1
    assert [m["module"] for m in pl["modules"]] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "head"]
    assert [m["passed"] for m in pl["modules"]] == [True, True, False, False, False, False]
    assert pl["depth"] == 1
    assert pl["first_divergence"]["module"] == "blocks.2"
    assert pl["first_divergence"]["source"] == _line("BLOCK-OUT-LINE")


def test_clean_artifact_names_no_module(built, tmp_path, capsys):
    """The artifact diffed against the model it was built from: nothing diverges."""
    code, out, pl = per_layer_run(capsys, tmp_path, built["perturbed.pt2"], built["perturbed"], "--per-layer")
    assert code == 0, out
    assert pl["first_divergence"] is None
    assert len(pl["modules"]) == 21
    for m in pl["modules"]:
        assert m["passed"] and m["max_rel"] <= 1e-5 and m["cosine"] >= 0.99999, m
    assert "per-layer: no module output over tolerance" in out


def test_model_that_does_not_match_the_artifact(built, tmp_path, capsys):
    """Same inputs and outputs, different layer sizes: the artifact's .irpa can't serve this model."""
    torch.manual_seed(0)
    other = _export(Net(hidden=24).eval(), tmp_path / "other.pt2")
    code = cli.main(["diff", str(other), str(built["perturbed"]), "--per-layer", "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmc: error: --per-layer: parameter 'blocks.0.fc1.weight'"), err
    assert "not compiled from this model" in lines[0]
    assert not (tmp_path / "r.json").exists()
