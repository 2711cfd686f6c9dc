"""Rough edges a new user hit (issue: daily use): folders and files that are not checkpoints get an
exit-2 line saying what is missing; broken pipes end quietly; argument errors answer before torch is
imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from test_cli_errors import assert_one_line_error, run_cli


@pytest.mark.parametrize(
    "make, needles",
    [
        (lambda d: d, ("an empty folder", "config.json", "params.json")),
        (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 16) and d, ("no config.json beside them",)),
        (lambda d: (d / "config.json").write_text('{"model_type": "gpt2"}') and d, ("'gpt2'", "model_type 'llama'")),
        (lambda d: torch.save({"w": torch.zeros(2)}, d / "bare.pt") or d / "bare.pt", ("a state dict (1 tensors", "no params.json")),
        (lambda d: torch.save(torch.nn.Linear(2, 2), d / "whole.pt") or d / "whole.pt", ("pickled Python object (torch.nn.modules.linear.Linear)", "state_dict()")),
        (lambda d: (d / "junk.pth").write_bytes(b"x" * 200) and d / "junk.pth", ("not a PyTorch checkpoint",)),
    ],
    ids=["empty-folder", "hf-without-config", "non-llama-config", "bare-state-dict", "whole-model", "garbage-pth"],
)
def test_not_a_checkpoint_says_what_is_missing(tmp_path, make, needles):
    src = tmp_path / "ck"
    src.mkdir()
    model = make(src)
    proc = run_cli("compile", model, "-o", tmp_path / "out.vmfb", cwd=tmp_path)
    msg = assert_one_line_error(proc, str(model))
    for n in needles:
        assert n in msg, msg
    assert not (tmp_path / "out.vmfb").exists()


def test_broken_pipe_ends_quietly(tmp_path):
    proc = subprocess.run(f"{sys.executable} -m llmc.compiler.cli targets --json | head -c 10", shell=True, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "{\n  \"cpu\":"[:10]
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv", [["compile", "missing.pt2"], ["compile", "x.pt2", "--target", "tpu"], ["run", "missing.vmfb", "--prompt-ids", "1"],
                                  ["info", "missing.vmfb"], ["targets"], ["diff", "missing.pt2"], ["bisect", "missing.pt2"]])
def test_argument_errors_do_not_import_torch(tmp_path, argv):
    """Answering a wrong flag must not wait for torch (seconds): the check runs before any heavy import."""
    code = f"import sys; from llmc.compiler import cli; rc = cli.main({argv!r}); print('torch' in sys.modules, rc)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    imported, rc = proc.stdout.split()[-2:]  # `targets` prints its table first
    assert imported == "False", proc.stderr
    assert rc == ("0" if argv == ["targets"] else "2")


def test_bare_state_dict_compiles_with_config(tmp_path):
    """`llmc compile llama.pt --config NAME`: a Meta state dict with nothing beside it compiles to the
    module its checkpoint folder gives (same greedy tokens); without --config, exit 2 naming the flag."""
    import shutil

    import llmc
    from llmc.tools.make_checkpoint import write_checkpoint

    ck = write_checkpoint("tiny", "meta", tmp_path / "ck", dtype="f32", seed=5)
    bare = tmp_path / "alone" / "llama.pt"
    bare.parent.mkdir()
    shutil.copy(ck / "consolidated.00.pth", bare)
    msg = assert_one_line_error(run_cli("compile", bare, "-o", tmp_path / "x.vmfb", cwd=tmp_path), "llama.pt", "params.json")
    assert "--config" in msg
    proc = run_cli("compile", bare, "--config", "tiny", "--max-seq-len", "32", "-o", tmp_path / "bare.vmfb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ref = llmc.compile(ck, output=tmp_path / "ref.vmfb", max_seq_len=32)
    got, want = llmc.load(tmp_path / "bare.vmfb"), llmc.load(ref)
    assert got.manifest["llm"]["config"]["dim"] == want.manifest["llm"]["config"]["dim"]
    assert got.generate([1, 2, 3], 8, stop_at_eos=False) == want.generate([1, 2, 3], 8, stop_at_eos=False)
    refused = run_cli("compile", bare, "--config", "tiny-llama3", "-o", tmp_path / "y.vmfb", cwd=tmp_path)
    assert_one_line_error(refused, "do not match config tiny-llama3")
