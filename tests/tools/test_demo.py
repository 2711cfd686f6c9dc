"""The README's first command runs tools/demo.py: it must finish with exit 0, its generated tokens
equal to eager PyTorch's and its diff passing (the demo itself checks both and exits 1 otherwise)."""

import json
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "tools" / "demo.py"


def test_demo_runs_and_agrees_with_eager(tmp_path):
    r = subprocess.run([sys.executable, str(DEMO), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "16/16 equal" in r.stdout
    report = json.loads((tmp_path / "diff.json").read_text())
    assert report["passed"] is True
    assert (tmp_path / "tiny.vmfb").stat().st_size < 1_000_000 and (tmp_path / "tiny.irpa").exists()
