"""llmc-opt's own command line: the pass list (the installed script, in a process of its own), and
one-line errors with exit 2 for bad use (its main() in this process: a Python with torch per case
would cost ~6 s apiece)."""

import subprocess
import sys
from pathlib import Path

import pytest

OPT = str(Path(sys.executable).parent / "llmc-opt")
HERE = Path(__file__).parent


def _run(*args, cwd):
    return subprocess.run([OPT, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_list_names_every_pass_with_its_kind(tmp_path):
    from llmc.passes import REGISTRY

    proc = _run("--list", cwd=tmp_path)
    assert proc.returncode == 0
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()}
    assert rows == {name: cls.kind for name, cls in REGISTRY.items()}


@pytest.mark.parametrize(
    "args, needles",
    [
        ((), ["give an input file"]),
        (("missing.mlir",), ["missing.mlir", "no such file"]),
        (("notes.txt",), ["notes.txt", "expected a .mlir or .pt2"]),
        (("bad.mlir",), ["bad.mlir", "not parseable MLIR"]),
        ((HERE / "log10_to_log.mlir", "--pass", "nope"), ["--pass nope", "no such pass"]),
        ((HERE / "log10_to_log.mlir", "--pass", "decompose-attention"), ["--pass decompose-attention", "graph pass runs on a .pt2"]),
        ((HERE / "log10_to_log.mlir", "--pass", "log10-to-log", "--pipeline"), ["--pass and --pipeline"]),
        ((HERE / "log10_to_log.mlir", "--target", "tpu"), ["--target='tpu'"]),
        ((HERE / "log10_to_log.mlir", "--option", "fixed_row_products"), ["--option fixed_row_products", "KEY=VALUE"]),
    ],
    ids=["no-input", "missing", "wrong-suffix", "bad-mlir", "unknown-pass", "graph-pass-on-mlir", "pass-and-pipeline", "bad-target",
         "bad-option"],
)
def test_bad_use_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, needles):
    from llmc.tools.llmc_opt import main

    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "bad.mlir").write_text("func.func @f( {")
    monkeypatch.chdir(tmp_path)
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("llmc-opt: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]
    assert out == ""
