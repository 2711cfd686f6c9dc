"""The inputs a diff runs both sides on: seeded random tensors from the signature, or an .npz file.

Random inputs follow the manifest's signature with a fixed seed (dynamic dims take `--seq` clamped
to their range, integer inputs stay below the smallest embedding table); an .npz file is checked
key by key against the signature (names, dtypes, shapes, folded constants) before anything runs.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from llmc import dtypes
from llmc.runtime.module import shape_text
from llmc.errors import UsageError


def int_high(ep) -> int:
    """Upper bound for random integer inputs: the smallest embedding table's row count (16 if none)."""
    highs = []
    for n in ep.graph.nodes:
        if n.op == "call_function" and "embedding" in str(n.target):
            w = n.args[0].meta.get("val") if hasattr(n.args[0], "meta") else None
            if isinstance(w, torch.Tensor):
                highs.append(int(w.shape[0]))
    return min(highs) if highs else 16


def _rebuild(leaves: list[tuple[str, object]]) -> tuple[tuple, dict]:
    """(args, kwargs) from flattened signature paths: "[0][i]" positional, "[1]['k']" keyword."""
    args, kwargs = [], {}
    for path, v in leaves:
        if path.startswith("[0]"):
            args.append(v)
        else:
            kwargs[path[len("[1]['") : -2]] = v
    return tuple(args), kwargs


def random_inputs(entry: dict, seed: int, int_high: int, seq: int | None = None) -> tuple[tuple, dict]:
    """Seeded inputs matching the entry's signature; dynamic dims take `seq` clamped to their range."""
    g = torch.Generator().manual_seed(seed)
    leaves = []
    for e in entry["inputs"]:
        if e["kind"] == "constant":
            leaves.append((e["path"], e["value"]))
            continue
        shape = []
        for d in e["shape"]:
            if isinstance(d, int):
                shape.append(d)
            else:
                want = seq if seq is not None else 17
                shape.append(max(d["min"], min(d["max"], want)))
        dtype = getattr(torch, e["dtype"])
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        else:
            t = torch.randint(0, int_high, shape, generator=g, dtype=dtype)
        leaves.append((e["path"], t))
    return _rebuild(leaves)


def _shape_ok(shape: list, want: list) -> bool:
    return len(shape) == len(want) and all(
        (isinstance(w, int) and w == s) or (isinstance(w, dict) and w["min"] <= s <= w["max"]) for w, s in zip(want, shape)
    )


def load_inputs(path: Path, entry: dict, aliases: dict | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) from an .npz file whose keys are the entry's input paths ("[0][0]") or names ("x").

    aliases: more accepted names, {name: path} (the model's own input names).
    Every tensor input must be present once, with the signature's dtype and a shape in range;
    constant inputs (folded at compile time) take their compiled value and must not be given.
    Raises UsageError naming the file and the key.
    """
    where = f"--inputs {path}"
    if not path.exists():
        raise UsageError(f"{where}: no such file")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{where}: not an .npz archive; write one with numpy.savez(path, x=array, ...)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # numpy raises ValueError, OSError, BadZipFile ... for damaged archives
        raise UsageError(f"{where}: not a readable .npz archive ({type(e).__name__}: {e}); write it with numpy.savez") from None

    paths = {e["path"]: e for e in entry["inputs"]}
    shown = {e["path"]: e.get("name") or e["path"] for e in entry["inputs"]}
    by_key = dict(paths)
    for name, p in (aliases or {}).items():  # the model's own names first: they are what users know
        if p in paths:
            by_key.setdefault(name, paths[p])
            shown[p] = name
    for e in entry["inputs"]:
        if e.get("name"):
            by_key.setdefault(e["name"], e)
    tensor_inputs = [e for e in entry["inputs"] if e["kind"] == "tensor"]
    expected = ", ".join(f"{shown[e['path']]} ({e['path']})" for e in tensor_inputs) or "none"
    extra = [k for k in arrays if k not in by_key]
    if extra:
        raise UsageError(f"{where}: unexpected key(s) {', '.join(map(repr, extra))}; the inputs are {expected}")
    given: dict[str, tuple[str, np.ndarray]] = {}
    for key, arr in arrays.items():
        e = by_key[key]
        if e["kind"] == "constant":
            raise UsageError(
                f"{where}: key {key!r} names an input folded into the module as the constant {e['value']!r}; remove it"
            )
        if e["path"] in given:
            raise UsageError(f"{where}: keys {given[e['path']][0]!r} and {key!r} both name input {e['path']}; keep one")
        given[e["path"]] = (key, arr)
    missing = [f"{shown[e['path']]} ({e['path']})" for e in tensor_inputs if e["path"] not in given]
    if missing:
        raise UsageError(f"{where}: missing key(s) {', '.join(missing)}; the inputs are {expected}")

    leaves = []
    for e in entry["inputs"]:
        if e["kind"] == "constant":
            leaves.append((e["path"], e["value"]))
            continue
        key, arr = given[e["path"]]
        want = dtypes.ELEMENT_TYPES.get(e["dtype"])
        if want is not None and not want.plain_numpy and arr.dtype.kind == "V" and arr.dtype.itemsize == want.itemsize:
            arr = arr.view(want.numpy)  # numpy stores ml_dtypes' bf16/fp8 as raw voids in .npz files
        got_dtype = dtypes.numpy_name(arr)
        if got_dtype != e["dtype"]:
            raise UsageError(f"{where}: key {key!r} is {got_dtype}, the module takes {e['dtype']}; save it with .astype(numpy.{e['dtype']})")
        if not _shape_ok(list(arr.shape), e["shape"]):
            raise UsageError(f"{where}: key {key!r} has shape {list(arr.shape)}, the module takes {shape_text(e['shape'])}")
        leaves.append((e["path"], dtypes.to_torch(arr)))
    return _rebuild(leaves)


def check_built_with(o, manifest: dict) -> None:
    """--target/--dtype/--arch given with an artifact must be what it was built with (every model kind)."""
    t = manifest["target"]
    for flag, given, built in (("--target", o.target, t["name"]), ("--dtype", o.dtype, manifest["dtype"]), ("--arch", o.arch, t.get("arch"))):
        if given is not None and given != built:
            raise UsageError(
                f"{flag}={given}: {o.artifact} was compiled with {flag}={built}; drop {flag} to diff it as built, "
                f"or leave out the artifact to compile {o.model.name} with {flag}={given} first"
            )
