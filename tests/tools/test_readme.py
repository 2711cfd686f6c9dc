"""README.md stays true: its shell and Python blocks run, in order, in a fresh folder, as a new user
would run them after `make demo` (the first block, the setup itself, is what CI runs around this).

Optional parts written ` [--flag ...]` are dropped; every command must exit 0. The folder gets links to the
repository's tools/ and .venv/ so relative paths in the README resolve as they do in a clone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _blocks() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(sh|python)\n(.*?)```", text, re.S)]


def test_readme_blocks_run(tmp_path):
    blocks = _blocks()
    assert blocks[0][0] == "sh" and "make demo" in blocks[0][1]  # the setup block: not run here
    (tmp_path / "tools").symlink_to(REPO / "tools")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for kind, body in blocks[1:]:
        if kind == "python":
            cmds = [[sys.executable, "-c", body]]
        else:
            lines = [re.sub(r"\s+\[--[^\]]*\]", "", l.split(" #")[0]).strip() for l in body.replace("\\\n", " ").splitlines()]
            cmds = [["bash", "-c", l] for l in lines if l]
        for cmd in cmds:
            proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"README {kind} block failed:\n{cmd[-1]}\n--- stderr ---\n{proc.stderr[-3000:]}"
            ran += 1
    assert ran >= 10  # every block ran, not just the first
