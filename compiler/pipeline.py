"""The ordered pass list per target and dtype, and the runner that applies it.

Phases (in order; each pass is one file in passes/):
  0. import (compiler/importer.py): weights -> external parameters (a hook, since it needs the data)
  1. dtype safety passes (fp8 / bf16 / f16): none yet
  2. layout passes: attention is decomposed before import on llvm-cpu (compiler/export.py)

Capability gating happens here, in one place: a pass whose `requires` the target does not meet is
skipped and the reason is logged and recorded in the manifest.
"""

from __future__ import annotations

import logging
from pathlib import Path

from llmc.passes._base import REGISTRY, PassStats

log = logging.getLogger("llmc.pipeline")

# The ordered list of pass names, per phase. Empty for now: the cpu path of f32/f16/bf16 needs no
# rewrite beyond the importer hook and the export-time decomposition.
PIPELINE: list[str] = []


def build(backend: str, dtype: str) -> tuple[list, list[dict]]:
    """Returns (pass instances to run, skipped [{name, reason}])."""
    run, skipped = [], []
    for name in PIPELINE:
        cls = REGISTRY[name]
        reason = cls.requires.why_not(backend, dtype)
        if reason:
            log.info("pass %s skipped: %s", name, reason)
            skipped.append({"name": name, "reason": reason})
        else:
            run.append(cls())
    return run, skipped


def run_passes(module, passes: list, dump_dir: Path | None = None) -> list[PassStats]:
    stats = []
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00-import.mlir").write_text(str(module))
    for i, p in enumerate(passes, start=1):
        stats.append(p.run(module))
        if dump_dir is not None:
            (dump_dir / f"{i:02d}-{p.name}.mlir").write_text(str(module))
    return stats
