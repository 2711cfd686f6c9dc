"""Outputs never overwrite inputs (issue: `cd hf_ckpt && llmc compile config.json` used to write the
manifest over the checkpoint's own config.json, and the next compile of that folder failed).

Runs the real CLI: the refusal must come before any work, with exit 2, one line, and every file of
the checkpoint byte-identical afterwards."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_errors import assert_one_line_error, run_cli


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module", params=["hf", "meta"])
def checkpoint(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ck-{request.param}") / "tiny"
    subprocess.run([sys.executable, "tools/make_checkpoint.py", "--config", "tiny", "--format", request.param, "--out", str(out)],
                   check=True, capture_output=True, cwd=Path(__file__).resolve().parents[2])
    return request.param, out


def test_output_onto_an_input_is_refused(checkpoint):
    fmt, folder = checkpoint
    config = "config.json" if fmt == "hf" else "params.json"
    before = _digest(folder)
    # -o NAME.vmfb puts the manifest at NAME.json: naming it after the config would overwrite it.
    proc = run_cli("compile", config, "-o", config.replace(".json", ".vmfb"), "--max-seq-len", "16", cwd=folder)
    msg = assert_one_line_error(proc, config)
    assert "is an input of this compile" in msg and "-o" in msg
    assert _digest(folder) == before  # nothing written, nothing changed


def test_config_file_as_model_names_the_output_after_the_folder(checkpoint, tmp_path):
    fmt, folder = checkpoint
    config = "config.json" if fmt == "hf" else "params.json"
    before = _digest(folder)
    proc = run_cli("compile", folder / config, "--max-seq-len", "16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.irpa", "tiny.json", "tiny.vmfb"]
    assert _digest(folder) == before
