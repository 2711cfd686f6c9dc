"""The `llmc` CLI on bad input: one `llmc: error:` line naming the file or flag, exit 2, no traceback,
no files left behind. The list of error cases runs `llmc` in this process (`llmc_here`: a subprocess
is a Python importing torch, 3-10 s each); what only the real process shows runs as a subprocess, what
a user or a CI script sees (`run_cli`): torch's warnings on a bad archive, argparse's usage line,
--debug's traceback, and the compile/info/diff round trip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import llmc_in_process

from llmc.models import zoo

CLI = [sys.executable, "-m", "llmc.compiler.cli"]


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def snapshot(*dirs: Path) -> set[Path]:
    """Every file and folder under `dirs`, hidden ones included (temporaries start with a dot)."""
    return {p for d in dirs for p in d.rglob("*")}


def assert_one_line_error(proc: subprocess.CompletedProcess, *names: str, code: int = 2) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}, stderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{proc.stderr}"
    line = lines[0]
    assert line.startswith("llmc: error: "), line
    for name in names:
        assert name in line, f"{name!r} not named in {line!r}"
    return line


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A folder holding model.pt2 (zoo linear_stack), random.pt2 (random bytes) and notexport.pt2 (a zip)."""
    d = tmp_path_factory.mktemp("models")
    m, args, _ = zoo.build("linear_stack")
    torch.export.save(torch.export.export(m, args), d / "model.pt2")
    (d / "random.pt2").write_bytes(os.urandom(4096).replace(b"PK", b"QK"))  # never a zip signature
    with zipfile.ZipFile(d / "notexport.pt2", "w") as z:
        z.writestr("notes/readme.txt", "a zip archive, but not one torch.export.save wrote\n")
        z.writestr("weights.bin", os.urandom(256))
    assert zipfile.is_zipfile(d / "notexport.pt2") and not zipfile.is_zipfile(d / "random.pt2")
    return d


@pytest.fixture
def work(tmp_path) -> Path:
    """The command's working folder, with an existing (empty) output folder `out/`."""
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.fixture
def llmc_here(work, monkeypatch):
    """`llmc ARGS` in this process (conftest.llmc_in_process) with `work` as the working folder: exit
    code, stdout and stderr like run_cli's. An exception that escapes the CLI fails the test itself."""
    monkeypatch.chdir(work)
    return llmc_in_process


# (id, argv after `llmc`, strings the error line must contain); "{model}" is model.pt2's path.
COMPILE_BAD_FLAGS = [
    ("unknown-target", ["--target", "tpu"], ["--target", "tpu"]),
    ("unknown-arch", ["--arch", "pentium9000"], ["--arch", "pentium9000"]),
    ("unknown-dtype", ["--dtype", "f12"], ["--dtype", "f12"]),
    ("unknown-gpu-arch", ["--target", "hip", "--arch", "gfx90a"], ["--arch", "gfx90a"]),
    ("fp8-option-without-fp8", ["--fp8-exclude", "lm_head.*"], ["--fp8-exclude", "--dtype fp8 or int8 only"]),
    ("quant-option-without-quant", ["--dtype", "f16", "--quant-exclude", "lm_head.*"], ["--quant-exclude", "--dtype fp8 or int8 only", "compiling f16"]),
    ("fp8-scales-with-int8", ["--dtype", "int8", "--fp8-scales", "tensor"], ["--fp8-scales", "--dtype fp8 only", "compiling int8"]),
    ("int8-unknown-target", ["--dtype", "int8", "--target", "tpu"], ["--target", "tpu"]),
    ("int8-unknown-gpu-arch", ["--dtype", "int8", "--target", "cuda", "--arch", "sm_100"], ["--arch", "sm_100"]),
    ("config-not-llama", ["--config", "tiny"], ["--config", "Llama weights files"]),
    ("max-seq-len-not-llama", ["--max-seq-len", "64"], ["--max-seq-len", "Llama checkpoints"]),
    ("tensor-parallel-not-llama", ["--tensor-parallel", "2"], ["--tensor-parallel", "Llama checkpoints"]),
]


@pytest.mark.parametrize("flags,names", [c[1:] for c in COMPILE_BAD_FLAGS], ids=[c[0] for c in COMPILE_BAD_FLAGS])
def test_compile_bad_target_options(flags, names, model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("compile", model_dir / "model.pt2", "-o", work / "out" / "model.vmfb", *flags)
    assert_one_line_error(proc, *names)
    assert proc.stdout == ""
    assert snapshot(work, model_dir) == before


def test_bisect_max_seq_len_is_for_checkpoints(model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("bisect", model_dir / "model.pt2", "--max-seq-len", "64", "-o", work / "b")
    assert_one_line_error(proc, "--max-seq-len", "Llama checkpoints")
    assert snapshot(work, model_dir) == before


def test_compile_missing_model(model_dir, work, llmc_here):
    before = snapshot(work)
    proc = llmc_here("compile", "nope.pt2", "-o", "out/nope.vmfb")
    assert_one_line_error(proc, "nope.pt2", "no such file")
    assert snapshot(work) == before


def test_compile_missing_model_default_output(work, llmc_here):
    """Without -o the output would go to ./nope.vmfb: nothing may be written there either."""
    before = snapshot(work)
    proc = llmc_here("compile", "nope.pt2")
    assert_one_line_error(proc, "nope.pt2")
    assert snapshot(work) == before
    assert snapshot(work) == before


def test_compile_random_bytes_pt2(model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("compile", model_dir / "random.pt2", "-o", "out/random.vmfb")
    assert_one_line_error(proc, "random.pt2", "not a torch.export archive")
    assert snapshot(work, model_dir) == before


def test_compile_zip_not_export_archive_exit_code_and_no_files(model_dir, work):
    before = snapshot(work, model_dir)
    proc = run_cli("compile", model_dir / "notexport.pt2", "-o", "out/notexport.vmfb", cwd=work)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("llmc: error: ") and "notexport.pt2" in last, proc.stderr
    assert snapshot(work, model_dir) == before


def test_compile_zip_not_export_archive_one_line_error(model_dir, work):
    proc = run_cli("compile", model_dir / "notexport.pt2", "-o", "out/notexport.vmfb", cwd=work)
    line = assert_one_line_error(proc, "notexport.pt2")
    assert "warnings above" not in line


def test_compile_output_dir_missing(model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("compile", model_dir / "model.pt2", "-o", "nodir/model.vmfb")
    assert_one_line_error(proc, "-o", "nodir", "does not exist")
    assert not (work / "nodir").exists()
    assert snapshot(work, model_dir) == before


@pytest.mark.parametrize("name", ["model.bin", "model.json", "model"])
def test_compile_output_not_vmfb(name, model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("compile", model_dir / "model.pt2", "-o", f"out/{name}")
    assert_one_line_error(proc, "-o", f"out/{name}", ".vmfb")
    assert snapshot(work, model_dir) == before


def test_compile_model_not_pt2(model_dir, work, llmc_here):
    (work / "model.pth").write_bytes(b"not a checkpoint")
    before = snapshot(work)
    proc = llmc_here("compile", "model.pth", "-o", "out/model.vmfb")
    assert_one_line_error(proc, "model.pth", "not a PyTorch checkpoint")
    assert snapshot(work) == before


def test_info_missing_file(work, llmc_here):
    before = snapshot(work)
    proc = llmc_here("info", "out/missing.vmfb")
    assert_one_line_error(proc, "missing.vmfb", "no such file")
    assert proc.stdout == ""
    assert snapshot(work) == before


def test_diff_missing_artifact(model_dir, work, llmc_here):
    before = snapshot(work, model_dir)
    proc = llmc_here("diff", model_dir / "model.pt2", "out/missing.vmfb")
    assert_one_line_error(proc, "missing.vmfb", "no such file")
    assert "PASS" not in proc.stdout
    assert snapshot(work, model_dir) == before


def test_diff_missing_model(work, llmc_here):
    (work / "out" / "model.vmfb").write_bytes(b"")  # exists; the .pt2 is what's missing
    before = snapshot(work)
    proc = llmc_here("diff", "gone.pt2", "out/model.vmfb")
    assert_one_line_error(proc, "gone.pt2", "no such file")
    assert snapshot(work) == before


def test_argparse_error_is_one_line(work):
    proc = run_cli("compile", cwd=work)  # the model argument is missing
    assert_one_line_error(proc, "model")


def test_debug_shows_traceback(work):
    proc = run_cli("compile", "nope.pt2", "-o", "out/nope.vmfb", "--debug", cwd=work)
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert "UsageError" in proc.stderr
    assert proc.stderr.splitlines()[-1] == "llmc: error: nope.pt2: no such file or directory"
    assert list((work / "out").iterdir()) == []


def test_debug_before_subcommand_shows_traceback(work):
    proc = run_cli("--debug", "compile", "nope.pt2", "-o", "out/nope.vmfb", cwd=work)
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr


def test_compile_info_diff_roundtrip(model_dir, work):
    out = work / "out"
    proc = run_cli("compile", model_dir / "model.pt2", "-o", "out/model.vmfb", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "llmc: error" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.irpa", "model.json", "model.vmfb"]
    # Nothing outside out/ either (no default-named outputs, no reproducers, no temporaries).
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == [
        "out", "out/model.irpa", "out/model.json", "out/model.vmfb"
    ]
    assert "out/model.vmfb" in proc.stdout
    assert (out / "model.vmfb").stat().st_size > 0 and (out / "model.irpa").stat().st_size > 0

    info = run_cli("info", "out/model.vmfb", cwd=work)
    assert info.returncode == 0, info.stderr
    assert info.stderr == ""
    entries = [line for line in info.stdout.splitlines() if line.startswith("entry:")]
    assert entries == ["entry:    main(float32[2, 8, 64])"], info.stdout

    d = run_cli("diff", model_dir / "model.pt2", "out/model.vmfb", cwd=work)
    assert d.returncode == 0, d.stdout + d.stderr
    last = d.stdout.splitlines()[-1]
    assert last.startswith("PASS: 1 output(s)"), d.stdout
    assert "FAIL" not in d.stdout
    # diff only reads: the output folder is unchanged.
    assert sorted(p.name for p in out.iterdir()) == ["model.irpa", "model.json", "model.vmfb"]
