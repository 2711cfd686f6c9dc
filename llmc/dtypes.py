"""The one dtype table: llmc's name <-> torch dtype <-> numpy/ml_dtypes dtype <-> MLIR element type <-> bytes.

Every part of llmc that names an element type (export, the importer's external parameters, the
manifest's signatures, the runtime's conversions, diff's .npz inputs, bisect's reproducers) looks it
up here, so a new type (fp8 today) is added once.

Two kinds of name:
- element types (`ELEMENT_TYPES`), keyed by the name the manifest records, which is torch's own
  (`float32`, `bfloat16`, `float8_e4m3fn`, ...);
- compute dtypes (`COMPUTE_DTYPES`), what `--dtype` takes: `f32`, `f16`, `bf16` are one element type
  each; `fp8` and `int8` are policies (weight-only quantization: E4M3 codes in the target's flavour,
  or symmetric int8 codes, with per-channel f32 scales; math in the target's compute dtype, f32 or
  f16) that the dtype passes implement, so they have no single torch dtype.

This module is shared by the compiler and the runtime; it imports numpy, and torch and ml_dtypes
only when a conversion needs them (so `llmc --help` and argument errors stay fast), never the compiler.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class ElementType:
    name: str  # the manifest's name: torch's dtype name without "torch."
    mlir: str  # element type in torch-dialect value types (!torch.vtensor<[..], ui8>)
    builtin: str  # element type in builtin tensors (signless integers: tensor<..xi8>)
    itemsize: int
    numpy_name: str  # numpy or ml_dtypes dtype name
    floating: bool
    safetensors: str  # the safetensors header's dtype code

    @property
    def numpy(self) -> np.dtype:
        return _numpy_dtype(self.numpy_name)

    @property
    def torch(self):
        """The torch dtype (torch.bfloat16, ...)."""
        import torch

        return getattr(torch, self.name)

    @property
    def plain_numpy(self) -> bool:
        """numpy itself has the type (so .npy files and iree-run-module's --input carry it); bf16 and fp8
        need ml_dtypes."""
        return hasattr(np, self.numpy_name)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(name: str) -> np.dtype:
    if hasattr(np, name) and name not in ("bfloat16",):
        return np.dtype(name)
    import ml_dtypes  # bf16 and the fp8 formats: numpy has none

    return np.dtype(getattr(ml_dtypes, name))


def _e(name, mlir, itemsize, st, numpy_name=None, builtin=None, floating=True):
    return ElementType(name, mlir, builtin or mlir, itemsize, numpy_name or name, floating, st)


ELEMENT_TYPES: dict[str, ElementType] = {
    e.name: e
    for e in (
        _e("float64", "f64", 8, "F64"),
        _e("float32", "f32", 4, "F32"),
        _e("float16", "f16", 2, "F16"),
        _e("bfloat16", "bf16", 2, "BF16"),
        # fp8: E4M3FN (OCP, max 448) and E4M3FNUZ (AMD MI300's, max 240, bias 8), E5M2 (gradients, KV).
        _e("float8_e4m3fn", "f8E4M3FN", 1, "F8_E4M3"),
        _e("float8_e4m3fnuz", "f8E4M3FNUZ", 1, "F8_E4M3FNUZ"),
        _e("float8_e5m2", "f8E5M2", 1, "F8_E5M2"),
        _e("int64", "si64", 8, "I64", builtin="i64", floating=False),
        _e("int32", "si32", 4, "I32", builtin="i32", floating=False),
        _e("int16", "si16", 2, "I16", builtin="i16", floating=False),
        _e("int8", "si8", 1, "I8", builtin="i8", floating=False),
        _e("uint8", "ui8", 1, "U8", builtin="i8", floating=False),
        _e("bool", "i1", 1, "BOOL", numpy_name="bool_", floating=False),
        _e("complex64", "complex<f32>", 8, "C64", floating=False),
        _e("complex128", "complex<f64>", 16, "C128", floating=False),
    )
}



@functools.lru_cache(maxsize=None)
def _by_torch() -> dict:
    return {e.torch: e for e in ELEMENT_TYPES.values()}

# --dtype names -> the element type weights and activations get (None: a policy, see the docstring).
COMPUTE_DTYPES: dict[str, str | None] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "fp8": None, "int8": None}

FP8_FLAVOURS = {"e4m3fn": "float8_e4m3fn", "e4m3fnuz": "float8_e4m3fnuz", "e5m2": "float8_e5m2"}


def of_torch(dtype) -> ElementType:
    try:
        return _by_torch()[dtype]
    except KeyError:
        raise KeyError(f"{dtype} has no entry in llmc's dtype table (llmc/dtypes.py)") from None


def by_name(name: str) -> ElementType:
    """The element type for a manifest name (`bfloat16`) or a torch dtype string (`torch.bfloat16`)."""
    return ELEMENT_TYPES[name.removeprefix("torch.")]


def name_of(dtype) -> str:
    """The manifest's name for a torch dtype: `bfloat16`."""
    return of_torch(dtype).name


def compute_torch_dtype(dtype: str):
    """torch dtype of a --dtype name (f32 -> torch.float32); None for fp8/int8 (policies) or an unknown name."""
    element = COMPUTE_DTYPES.get(dtype)
    return ELEMENT_TYPES[element].torch if element else None


def of_numpy(arr_dtype: np.dtype) -> ElementType | None:
    """The element type of a numpy dtype (ml_dtypes' bf16/fp8 included); None when llmc has none."""
    for e in ELEMENT_TYPES.values():
        if e.numpy == arr_dtype:
            return e
    return None


def _same_size_int(itemsize: int):
    import torch

    return {1: (np.uint8, torch.uint8), 2: (np.int16, torch.int16)}[itemsize]


def to_numpy(t) -> np.ndarray:
    """A CPU numpy view of a tensor; bf16/fp8 become ml_dtypes arrays (torch can't hand those to numpy)."""
    t = t.detach().cpu().contiguous()
    e = of_torch(t.dtype)
    if e.plain_numpy:
        return t.numpy()
    np_int, torch_int = _same_size_int(e.itemsize)
    return t.view(torch_int).numpy().view(e.numpy)


def numpy_name(arr: np.ndarray) -> str:
    """The manifest's dtype name of a numpy array (ml_dtypes' bf16/fp8 included), or numpy's own name."""
    e = of_numpy(arr.dtype)
    return e.name if e is not None else str(arr.dtype)


def to_torch(arr: np.ndarray, copy: bool = True):
    """A tensor from a numpy array (ml_dtypes' bf16/fp8 included); a copy unless copy=False."""
    import torch

    e = of_numpy(arr.dtype)
    if e is None or e.plain_numpy:
        return torch.from_numpy(np.array(arr) if copy else np.asarray(arr))
    np_int, torch_int = _same_size_int(e.itemsize)
    raw = np.ascontiguousarray(arr).view(np_int)
    return torch.from_numpy(raw.copy() if copy else raw).view(e.torch)
