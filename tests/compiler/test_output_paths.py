"""Outputs never overwrite inputs (issue: `cd hf_ckpt && llmc compile config.json` used to write the
manifest over the checkpoint's own config.json, and the next compile of that folder failed).

Runs the CLI's entry point in this process (conftest.llmc_in_process: what llmc says and writes is
checked, not the interpreter): the refusal must come before any work, with exit 2, one line, and
every file of the checkpoint byte-identical afterwards. The checkpoint is a one-layer tiny Llama:
what is checked is where the outputs go, not the model, and one layer compiles faster."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from conftest import llmc_in_process

from test_cli_errors import assert_one_line_error


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module", params=["hf", "meta"])
def checkpoint(request, tmp_path_factory):
    from llmc.models.llama.config import get_config
    from llmc.tools.make_checkpoint import write_checkpoint

    config = dataclasses.replace(get_config("tiny"), n_layers=1, name="tiny-1-layer")
    out = write_checkpoint(config, request.param, tmp_path_factory.mktemp(f"ck-{request.param}") / "tiny")
    return request.param, out


def test_output_onto_an_input_is_refused(checkpoint, monkeypatch):
    fmt, folder = checkpoint
    config = "config.json" if fmt == "hf" else "params.json"
    before = _digest(folder)
    monkeypatch.chdir(folder)
    # -o NAME.vmfb puts the manifest at NAME.json: naming it after the config would overwrite it.
    proc = llmc_in_process("compile", config, "-o", config.replace(".json", ".vmfb"), "--max-seq-len", "16")
    msg = assert_one_line_error(proc, config)
    assert "is an input of this compile" in msg and "-o" in msg
    assert _digest(folder) == before  # nothing written, nothing changed


def test_config_file_as_model_names_the_output_after_the_folder(checkpoint, tmp_path, monkeypatch):
    fmt, folder = checkpoint
    config = "config.json" if fmt == "hf" else "params.json"
    before = _digest(folder)
    monkeypatch.chdir(tmp_path)
    proc = llmc_in_process("compile", folder / config, "--max-seq-len", "16")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.irpa", "tiny.json", "tiny.vmfb"]
    assert _digest(folder) == before
