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


def same_quantized_weights(module: torch.nn.Module, params, manifest: dict) -> int:
    """Replace, in place, each weight the artifact stores quantized (--dtype fp8 or int8) by the value
    the device computes with, decode(q) * s (passes/fp8_weights.py, passes/int8_weights.py), in the
    weight's own dtype. The weights are the ones with a `<name>_<dtype>_scale` entry in the artifact's
    .irpa, `params`; q and s are recomputed from the module's weight with the pass's own quantizer and
    scale mode (deterministic, and fp8's FN->FNUZ conversion is lossless, so every flavour gives the
    same values). Returns how many were replaced.
    """
    import iree.runtime as rt

    from llmc.errors import UsageError
    from llmc.passes._quantized_weights import CODECS, dequantized  # importing llmc.passes registers the codecs

    codec = CODECS[manifest["dtype"]]
    index = rt.ParameterIndex()
    index.load(str(params))
    suffix = codec.scale_suffix
    names = {k[: -len(suffix)] for k, _ in index.items() if k.endswith(suffix)}
    per_channel = manifest["target"].get("pass_options", {}).get(f"{codec.option}_scales", "channel") != "tensor"
    tensors = dict([*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)])
    missing = sorted(names - tensors.keys())
    if missing:
        raise UsageError(f"{params}: {codec.dtype} weight {missing[0]} is not in the model; diff against the model the artifact was compiled from")
    with torch.no_grad():
        for name in sorted(names):
            t = tensors[name]
            t.copy_(dequantized(codec, t, per_channel))
    return len(names)


same_fp8_weights = same_quantized_weights  # the older name


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
