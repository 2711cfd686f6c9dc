# lit configuration for llmc's pass tests: IR in, IR out, checked with FileCheck (the `filecheck` package).
# Each pass has a file named after it (positive cases), a `_negative` file (left alone) and, where the
# pass can refuse, an `_invalid` file. `.mlir` files run IR passes through `llmc-opt`; `.py` files build
# a small torch.export archive (%python %s %t.pt2) for graph passes, then run `llmc-opt` on it.
# tests/passes/test_lit.py runs each file from pytest, so CI counts them.
import os
import sys

import lit.formats

config.name = "llmc-passes"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "conftest.py", "Inputs", "__pycache__"] + [f for f in os.listdir(os.path.dirname(__file__)) if f.startswith("test_")]
config.test_source_root = os.path.dirname(__file__)
# Where RUN lines' %t files go: test_lit.py gives each pytest run its own folder, so two runs at once (xdist
# workers that each run this module) do not write the same Output/ files; lit's default otherwise.
if os.environ.get("LLMC_LIT_EXEC_ROOT"):
    config.test_exec_root = os.environ["LLMC_LIT_EXEC_ROOT"]
forkserver = os.environ.get("LLMC_LIT_FORKSERVER")  # set by test_lit.py: see tests/forkserver.py
if forkserver:
    # Each `%python` / `llmc-opt` RUN command becomes a fork of one warm Python (torch imported once),
    # with the same argv, stdio, working directory and environment.
    client = f"{sys.executable} -S {os.path.join(os.path.dirname(os.path.dirname(__file__)), 'forkserver.py')} {forkserver}"
    config.substitutions.append(("%python", f"{client} python"))
    config.substitutions.append((r"(?<![\w./-])llmc-opt(?![\w.-])", f"{client} llmc-opt"))
else:
    config.substitutions.append(("%python", sys.executable))
bindir = os.path.dirname(sys.executable)  # the venv's llmc-opt and filecheck
config.environment["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
for var in ("HOME", "TMPDIR", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
