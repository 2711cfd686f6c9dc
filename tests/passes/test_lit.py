"""Runs every lit/FileCheck file in tests/passes/ (one pytest case each, so CI counts them).

Each file is IR in, IR out: `.mlir` files go through `llmc-opt --pass NAME` (IR passes), `.py` files
write a small .pt2 and run `llmc-opt` on it (graph passes). Most files also run `--pipeline` for a
target, so removing a pass from compiler/pipeline.py fails its test.
"""

import re
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


@pytest.fixture(scope="module")
def lit_results() -> dict[str, tuple[str, str]]:
    """One lit run over every file, two at a time (each RUN line is its own Python process, so lit's
    workers use both of CI's cores): file -> (result code, lit's output for it when it failed)."""
    lit = Path(sys.executable).parent / "lit"
    proc = subprocess.run([str(lit), "-v", "-j", "2", str(HERE)], capture_output=True, text=True, timeout=1800)
    out = proc.stdout
    results = {m.group(2): (m.group(1), "") for m in re.finditer(r"^([A-Z]+): llmc-passes :: (\S+) \(", out, re.M)}
    for m in re.finditer(r"^\*+ TEST 'llmc-passes :: (\S+)' FAILED \*+\n(.*?)^\*{20}$", out, re.M | re.S):
        results[m.group(1)] = (results.get(m.group(1), ("FAIL", ""))[0], m.group(2))
    assert results, f"lit ran nothing (exit {proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-2000:]}"
    return results


@pytest.mark.parametrize("case", CASES)
def test_lit(lit_results, case):
    code, output = lit_results.get(case, ("NOT RUN", ""))
    assert code == "PASS", f"{case}: {code}\n{output[-6000:]}"
