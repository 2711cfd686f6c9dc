"""llmc's rewrite passes: one file per pass; importing this package registers them all.

`_base.py` holds the pass kinds and the registry; `compiler/pipeline.py` says which passes run for a
target and dtype; `llmc-opt` runs them by name on a .mlir or .pt2 file.
"""

import importlib
import pkgutil

from llmc.passes._base import REGISTRY  # noqa: F401  (the registry, filled below)

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
