"""Rough edges a new user hit (issue: daily use): folders and files that are not checkpoints get an
exit-2 line saying what is missing; broken pipes end quietly; argument errors answer before torch is
imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import llmc_in_process
from test_cli_errors import assert_one_line_error


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
    """In-process (conftest.llmc_in_process): a list of error cases, each a Python with torch otherwise."""
    src = tmp_path / "ck"
    src.mkdir()
    model = make(src)
    proc = llmc_in_process("compile", model, "-o", tmp_path / "out.vmfb")
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
    module its checkpoint folder gives: `llmc diff FOLDER bare.vmfb` (the folder's config, prompt and
    greedy decode steps against eager PyTorch, f32 tolerance profile: max_rel 1e-5, cosine 0.99999)
    passes. Without --config, exit 2 naming the flag; a config the weights do not fit is refused.
    In-process (conftest.llmc_in_process): what is checked is what llmc says, not the interpreter."""
    import shutil

    import llmc
    from llmc.tools.make_checkpoint import write_checkpoint

    ck = write_checkpoint("tiny", "meta", tmp_path / "ck", dtype="f32", seed=5)
    bare = tmp_path / "alone" / "llama.pt"
    bare.parent.mkdir()
    shutil.copy(ck / "consolidated.00.pth", bare)
    msg = assert_one_line_error(llmc_in_process("compile", bare, "-o", tmp_path / "x.vmfb"), "llama.pt", "params.json")
    assert "--config" in msg
    refused = llmc_in_process("compile", bare, "--config", "tiny-llama3", "-o", tmp_path / "y.vmfb")
    assert_one_line_error(refused, "do not match config tiny-llama3")
    assert not list(tmp_path.glob("[xy].*"))
    proc = llmc_in_process("compile", bare, "--config", "tiny", "--max-seq-len", "16", "-o", tmp_path / "bare.vmfb")
    assert proc.returncode == 0, proc.stderr
    got = llmc.load(tmp_path / "bare.vmfb")
    assert got.manifest["llm"]["config"]["name"] == "tiny" and got.manifest["llm"]["config"]["dim"] == 64
    diff = llmc_in_process("diff", ck, tmp_path / "bare.vmfb", "--steps", "4")
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "greedy tokens: 4 of 4 decode-step inputs agree" in diff.stdout, diff.stdout
