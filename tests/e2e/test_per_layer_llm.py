"""`llmc diff CHECKPOINT ARTIFACT --per-layer` for Llama checkpoints: the artifact was compiled from a
copy of the checkpoint whose `model.layers.1.mlp.down_proj` weight differs; diffed against the
unperturbed checkpoint, both entry points blame that module: the prefill (on the prompt) and a decode
step (on eager's cache after the prefill). The same artifact diffed against the checkpoint it was
compiled from, the perturbed copy, blames nothing (so one compile serves both tests).
Tolerances: the f32 profile (llmc.compiler.diff_metrics.TOLERANCES: max_rel 1e-5, cosine 0.99999).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import llmc
from llmc.compiler import cli
from llmc.tools.make_checkpoint import write_checkpoint

PERTURBED = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("pl-llm")
    ck = write_checkpoint("tiny", "meta", root / "tiny", dtype="f32", seed=0)
    # The perturbed copy: the same files, one weight changed (Meta name of model.layers.1.mlp.down_proj).
    perturbed_ck = root / "perturbed"
    shutil.copytree(ck, perturbed_ck)
    sd = torch.load(perturbed_ck / "consolidated.00.pth", weights_only=True)
    w = sd["layers.1.feed_forward.w2.weight"]
    sd["layers.1.feed_forward.w2.weight"] = w + 0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(3))
    torch.save(sd, perturbed_ck / "consolidated.00.pth")
    perturbed = llmc.compile(perturbed_ck, output=root / "perturbed.vmfb", max_seq_len=16, quiet=True)
    return ck, perturbed_ck, perturbed


def _diff(ck, art, tmp_path, *extra):
    rep = tmp_path / "r.json"
    code = cli.main(["diff", str(ck), str(art.vmfb), "--steps", "2", "--per-layer", "--json", str(rep), *extra])
    return code, json.loads(rep.read_text())


def test_perturbed_layer_is_blamed_in_prefill_and_decode(built, tmp_path, capsys):
    ck, _, perturbed = built
    code, rep = _diff(ck, perturbed, tmp_path)
    out = capsys.readouterr().out
    assert code == 1
    located = {e["name"]: e["per_layer"] for e in rep["entry_points"] if e["per_layer"]}
    assert set(located) == {"prefill (per-layer)", "decode (per-layer)"}
    for name, pl in located.items():
        first = pl["first_divergence"]
        assert first is not None and first["module"] == PERTURBED, (name, first)
        assert first["type"].endswith("Linear")
        # every module before it in the graph matched eager
        before = [m for m in pl["modules"] if m["module"] != PERTURBED][: [m["module"] for m in pl["modules"]].index(PERTURBED)]
        assert all(m["passed"] for m in before), name
    assert f"per-layer prefill: first divergence: {PERTURBED}" in out
    assert f"per-layer decode: first divergence: {PERTURBED}" in out


def test_clean_artifact_blames_nothing(built, tmp_path, capsys):
    """The artifact diffed against its own checkpoint (at depth 2: layers.N.mlp, not its Linears)."""
    _, perturbed_ck, perturbed = built
    code, rep = _diff(perturbed_ck, perturbed, tmp_path, "--per-layer-depth", "2")
    assert code == 0, capsys.readouterr()
    located = [e["per_layer"] for e in rep["entry_points"] if e["per_layer"]]
    assert len(located) == 2
    for pl in located:
        assert pl["first_divergence"] is None and pl["modules"] and all(m["passed"] for m in pl["modules"])
        assert all(m["level"] <= 2 for m in pl["modules"])
