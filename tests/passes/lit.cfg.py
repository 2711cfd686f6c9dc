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
config.substitutions.append(("%python", sys.executable))
bindir = os.path.dirname(sys.executable)  # the venv's llmc-opt and filecheck
config.environment["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
for var in ("HOME", "TMPDIR", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
