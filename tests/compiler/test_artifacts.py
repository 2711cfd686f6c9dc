"""The artifact trio: weights only in the .irpa, a manifest that describes the module, IREE's own
iree-run-module running the .vmfb + .irpa unchanged, and reproducible: the same input compiled twice
gives identical bytes, and a recompile to the same path replaces the trio."""

import filecmp
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import llmc
from llmc.models import zoo


@pytest.fixture(scope="module")
def llama_art(tmp_path_factory):
    out = tmp_path_factory.mktemp("art")
    model, args, dynamic = zoo.build("tiny_llama")
    art = llmc.compile(model, args, dynamic_shapes=dynamic, output=out / "tl.vmfb")
    return model, args, art, dynamic


def test_weights_live_in_the_irpa_not_the_vmfb(llama_art):
    import iree.runtime as rt

    model, _, art, _ = llama_art
    weights = {k: v for k, v in model.state_dict().items()}
    index = rt.ParameterIndex()
    index.load(str(art.params))
    stored = {k: np.asarray(rt.parameter_index_entry_as_numpy_flat_ndarray(e)) for k, e in index.items()}
    for name, t in weights.items():
        assert name in stored, f"{name} missing from the .irpa"
        assert stored[name].tobytes() == t.contiguous().numpy().tobytes(), name
    # The vmfb holds code only: no weight's bytes appear in it.
    blob = art.vmfb.read_bytes()
    big = model.lm_head.weight.detach().numpy()[0].tobytes()
    assert big not in blob
    assert len(blob) < art.params.stat().st_size


def test_manifest_describes_the_module(llama_art):
    model, args, art, _ = llama_art
    m = json.loads(art.manifest.read_text())
    assert m["target"]["name"] == "cpu" and m["target"]["backend"] == "llvm-cpu"
    assert "--iree-llvmcpu-target-cpu=host" in m["iree_flags"]
    entry = m["entry_points"]["main"]
    (inp,) = entry["inputs"]
    assert inp["dtype"] == "int64" and inp["shape"][0] == 1 and inp["shape"][1]["min"] == 2 and inp["shape"][1]["max"] == 128
    assert entry["outputs"]["type"] == "tensor" and entry["outputs"]["shape"][2] == 256
    assert m["params"]["count"] == len(model.state_dict()) + 4  # + the rope cos/sin buffers of 2 layers
    assert m["params"]["bytes"] == sum(t.numel() * t.element_size() for t in model.state_dict().values()) + 4 * 256 * 16 * 4
    from llmc.compiler.artifacts import sha256_file

    assert m["params"]["sha256"] == sha256_file(art.params)
    assert m["versions"]["iree-base-compiler"] == "3.13.0"
    assert "avx2" in m["target"]["cpu_features"] or m["target"]["machine"] != "x86_64"


def test_iree_run_module_runs_the_trio_unchanged(llama_art, tmp_path):
    model, args, art, _ = llama_art
    ids = args[0]
    np.save(tmp_path / "ids.npy", ids.numpy())
    tool = Path(sys.executable).parent / "iree-run-module"
    proc = subprocess.run(
        [str(tool), "--device=local-task", f"--module={art.vmfb}", f"--parameters=model={art.params}",
         "--function=main", f"--input=@{tmp_path / 'ids.npy'}", f"--output=@{tmp_path / 'out.npy'}"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    got = torch.from_numpy(np.load(tmp_path / "out.npy"))
    with torch.no_grad():
        ref = model(ids)
    assert (got - ref).abs().max().item() / ref.abs().max().item() <= 1e-5


def test_recompile_is_identical_and_replaces_artifacts_atomically(llama_art, tmp_path):
    model, args, art, dynamic = llama_art
    out = tmp_path / "x.vmfb"
    # The fixture's input again, to another path: the same bytes (iree-compile used to embed the path
    # of its temporary input file in the .vmfb).
    again = llmc.compile(model, args, dynamic_shapes=dynamic, output=out)
    assert filecmp.cmp(again.vmfb, art.vmfb, shallow=False)
    assert filecmp.cmp(again.params, art.params, shallow=False)
    first = out.with_suffix(".json").read_text()
    llmc.compile(model, args, dtype="bf16", output=out)
    assert json.loads(out.with_suffix(".json").read_text())["dtype"] == "bf16" != json.loads(first)["dtype"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.irpa", "x.json", "x.vmfb"]


class _Twice(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def test_a_dynamic_dim_without_a_max_compiles_and_runs_at_any_size(tmp_path):
    """torch.export.Dim("b") with no max= has the upper bound int_oo; the signature used to crash on
    int() of it ("'Infinity' object has no attribute '_mpf_'", an llmc internal error)."""
    art = llmc.compile(_Twice(), (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("b")},), output=tmp_path / "t.vmfb")
    dim = art.read_manifest()["entry_points"]["main"]["inputs"][0]["shape"][0]
    assert dim["name"] == "b" and dim["max"] >= 2**31, dim
    mod = llmc.load(art)
    for rows in (1, 7, 300):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(mod(x), x * 2 + 1, rtol=0, atol=0)
