"""Runs every lit/FileCheck file in tests/passes/ (one pytest case each, so CI counts them).

Each file is IR in, IR out: `.mlir` files go through `llmc-opt --pass NAME` (IR passes), `.py` files
write a small .pt2 and run `llmc-opt` on it (graph passes). Most files also run `--pipeline` for a
target, so removing a pass from compiler/pipeline.py fails its test.
"""

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CASES = sorted(p.name for p in HERE.iterdir() if p.suffix in (".mlir", ".py") and not p.name.startswith(("test_", "lit.", "conftest")))


def test_every_pass_has_a_lit_file():
    from llmc.passes import REGISTRY

    stems = {c.rsplit(".", 1)[0].removesuffix("_negative").removesuffix("_invalid") for c in CASES}
    missing = [n for n in REGISTRY if n.replace("-", "_") not in stems]
    assert not missing, f"passes without a FileCheck test in tests/passes/: {missing}"


@pytest.mark.parametrize("case", CASES)
def test_lit(case):
    lit = Path(sys.executable).parent / "lit"
    proc = subprocess.run([str(lit), "-v", str(HERE / case)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
