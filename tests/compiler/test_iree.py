"""iree-compile runs out of process: a crash becomes exit 3 with a reproducer that reproduces it."""

import subprocess
import sys

import pytest
import torch

from llmc.compiler import iree
from llmc.errors import CompileError
from llmc.models import zoo

TRIVIAL = "func.func @f(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> { return %a : !torch.vtensor<[4],f32> }\n"
CPU = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]


def test_llvm_abort_becomes_compile_error_with_reproducer(tmp_path):
    # An unknown CPU name makes LLVM abort ("64-bit code requested on a subtarget that doesn't
    # support it"): a real crash, which llmc's own --arch check normally prevents.
    with pytest.raises(CompileError) as info:
        iree.compile_mlir(TRIVIAL, tmp_path / "x.vmfb", [*CPU, "--iree-llvmcpu-target-cpu=bogus"], repro_dir=tmp_path / "r", target_name="cpu")
    msg = str(info.value)
    assert "iree-compile" in msg and "Reproduce with: iree-compile" in msg
    repro = next((tmp_path / "r").iterdir())
    assert (repro / "input.mlir").read_text() == TRIVIAL
    assert "64-bit code requested" in (repro / "stderr.txt").read_text()
    assert not (tmp_path / "x.vmfb").exists() and not list(tmp_path.glob(".x*"))
    # The saved command reproduces the failure with IREE's own binary.
    rerun = subprocess.run(["sh", str(repro / "command.sh")], capture_output=True, text=True,
                           env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin"})
    assert rerun.returncode != 0 and "64-bit code requested" in rerun.stderr


def test_successful_compile_reports_peak_rss(tmp_path):
    run = iree.compile_mlir(TRIVIAL, tmp_path / "ok.vmfb", [*CPU, "--iree-llvmcpu-target-cpu=host"], repro_dir=tmp_path, target_name="cpu")
    assert (tmp_path / "ok.vmfb").stat().st_size > 0
    assert 10 < run.peak_rss_mb < 2000


def test_cli_crash_exits_3(tmp_path):
    model, args, _ = zoo.build("linear_stack")
    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, args), str(pt2))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "llmc.compiler.cli", "compile", str(pt2), "-o", str(out / "m.vmfb"),
         "--iree-flag=--iree-llvmcpu-target-cpu=bogus"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "Reproduce with" in proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 1 and names[0].startswith("llmc-repro-"), names  # no partial artifacts
