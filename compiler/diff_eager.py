"""Eager PyTorch as the reference side of a diff: the exported program in the artifact's dtype.

`llmc diff` and per-layer localisation both compare against it. When eager PyTorch itself fails on
the inputs there is nothing to compare against: EagerError, exit 3.
"""

from __future__ import annotations

import torch

from llmc import dtypes
from llmc.compiler import export
from llmc.errors import LlmcError


def eager_reference(ep, dtype: str):
    """A callable running the exported program eagerly in the artifact's dtype."""
    module = ep.module()
    if dtype != "f32":
        from llmc.passes._base import PassContext
        from llmc.passes.retarget_casts import RetargetCastsPass

        tdt = dtypes.compute_torch_dtype(dtype)
        # The same source pass the compile path runs (passes/retarget_casts.py), so both sides agree.
        RetargetCastsPass(PassContext(target=None, dtype=dtype)).run(module)
        module = export.CastInputs(export.convert_module(module, tdt), tdt)
    return module


class EagerError(LlmcError):
    """Eager PyTorch failed on the inputs (exit 3: nothing to compare against)."""

    exit_code = 3


def run_eager(fn, args: tuple, kwargs: dict):
    try:
        with torch.no_grad():
            return fn(*args, **kwargs)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EagerError(f"eager PyTorch failed on the diff inputs: {type(e).__name__}: {first}") from e
