"""The one dtype table: llmc's name <-> torch dtype <-> numpy/ml_dtypes dtype <-> MLIR element type <-> bytes.

Every part of llmc that names an element type (export, the importer's external parameters, the
manifest's signatures, the runtime's conversions, diff's .npz inputs, bisect's reproducers) looks it
up here, so a new type (fp8 today) is added once.

Two kinds of name:
- element types (`ELEMENT_TYPES`), keyed by the name the manifest records, which is torch's own
  (`float32`, `bfloat16`, `float8_e4m3fn`, ...);
- compute dtypes (`COMPUTE_DTYPES`), what `--dtype` takes: `f32`, `f16`, `bf16` are one element type
  each; `fp8` is a policy (E4M3 weights in the target's flavour with scales, math in bf16/f32) that the
  dtype passes implement, so it has no single torch dtype.

This module is shared by the compiler and the runtime; it imports torch, numpy and ml_dtypes only
(the runtime already needs all three), never the compiler.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class ElementType:
    name: str  # the manifest's name: torch's dtype name without "torch."
    torch: torch.dtype
    mlir: str  # element type in torch-dialect value types (!torch.vtensor<[..], ui8>)
    builtin: str  # element type in builtin tensors (signless integers: tensor<..xi8>)
    itemsize: int
    numpy_name: str  # numpy or ml_dtypes dtype name
    floating: bool

    @property
    def numpy(self) -> np.dtype:
        return _numpy_dtype(self.numpy_name)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(name: str) -> np.dtype:
    if hasattr(np, name) and name not in ("bfloat16",):
        return np.dtype(name)
    import ml_dtypes  # bf16 and the fp8 formats: numpy has none

    return np.dtype(getattr(ml_dtypes, name))


def _e(name, mlir, itemsize, numpy_name=None, builtin=None, floating=True):
    return ElementType(name, getattr(torch, name), mlir, builtin or mlir, itemsize, numpy_name or name, floating)


ELEMENT_TYPES: dict[str, ElementType] = {
    e.name: e
    for e in (
        _e("float64", "f64", 8),
        _e("float32", "f32", 4),
        _e("float16", "f16", 2),
        _e("bfloat16", "bf16", 2),
        # fp8: E4M3FN (OCP, max 448) and E4M3FNUZ (AMD MI300's, max 240, bias 8), E5M2 (gradients, KV).
        _e("float8_e4m3fn", "f8E4M3FN", 1),
        _e("float8_e4m3fnuz", "f8E4M3FNUZ", 1),
        _e("float8_e5m2", "f8E5M2", 1),
        _e("int64", "si64", 8, builtin="i64", floating=False),
        _e("int32", "si32", 4, builtin="i32", floating=False),
        _e("int16", "si16", 2, builtin="i16", floating=False),
        _e("int8", "si8", 1, builtin="i8", floating=False),
        _e("uint8", "ui8", 1, builtin="i8", floating=False),
        _e("bool", "i1", 1, numpy_name="bool_", floating=False),
        _e("complex64", "complex<f32>", 8, floating=False),
        _e("complex128", "complex<f64>", 16, floating=False),
    )
}

_BY_TORCH = {e.torch: e for e in ELEMENT_TYPES.values()}

# --dtype names -> the element type weights and activations get (None: a policy, see the docstring).
COMPUTE_DTYPES: dict[str, str | None] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "fp8": None}

FP8_FLAVOURS = {"e4m3fn": "float8_e4m3fn", "e4m3fnuz": "float8_e4m3fnuz", "e5m2": "float8_e5m2"}


def of_torch(dtype: torch.dtype) -> ElementType:
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise KeyError(f"{dtype} has no entry in llmc's dtype table (llmc/dtypes.py)") from None


def by_name(name: str) -> ElementType:
    """The element type for a manifest name (`bfloat16`) or a torch dtype string (`torch.bfloat16`)."""
    return ELEMENT_TYPES[name.removeprefix("torch.")]


def name_of(dtype: torch.dtype) -> str:
    """The manifest's name for a torch dtype: `bfloat16`."""
    return of_torch(dtype).name


def compute_torch_dtype(dtype: str) -> torch.dtype | None:
    """torch dtype of a --dtype name (f32 -> torch.float32); None for fp8 (a policy) or an unknown name."""
    element = COMPUTE_DTYPES.get(dtype)
    return ELEMENT_TYPES[element].torch if element else None


def of_numpy(arr_dtype: np.dtype) -> ElementType | None:
    """The element type of a numpy dtype (ml_dtypes' bf16/fp8 included); None when llmc has none."""
    for e in ELEMENT_TYPES.values():
        if e.numpy == arr_dtype:
            return e
    return None
