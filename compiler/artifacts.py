"""The artifact trio (NAME.vmfb, NAME.irpa, NAME.json) and the manifest's signature section.

Everything is written to temporary files in the output folder and renamed into place only when all
three exist, so a failure never leaves a half-written artifact behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from llmc.errors import CompileError


@dataclasses.dataclass(frozen=True)
class Artifact:
    vmfb: Path
    params: Path | None
    manifest: Path

    def load(self, device: str | None = None, **kw):
        from llmc.runtime import load

        return load(self, device, **kw)

    def read_manifest(self) -> dict:
        return json.loads(self.manifest.read_text())


def sha256_file(path: Path, chunk: int = 1 << 22, counter: list | None = None) -> str:
    """Hex sha256 of a file; `counter[0]` (when given) counts the bytes hashed so far, for progress."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if counter is not None:
                counter[0] += len(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_path(final: Path) -> Path:
    """A fresh temp file beside `final`, with the permissions a plain open() would give (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    return Path(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file beside it and a rename: never a half-written file."""
    tmp = temp_path(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# ---------------------------------------------------------------------------------------------
# Signature: what the runtime checks calls against.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dim(d, ep) -> int | dict:
    from llmc.compiler.importer import concrete_size

    d = concrete_size(d)  # a dim export specialised is static, as the importer types it
    if isinstance(d, int):
        return d
    expr = d.node.expr
    rng = ep.range_constraints.get(expr)
    lo = _bound(rng.lower, 0) if rng is not None else 0
    hi = _bound(rng.upper, 2**62) if rng is not None else 2**62
    return {"name": _dim_name(d), "min": lo, "max": min(hi, 2**62)}


def _bound(v, unbounded: int) -> int:
    """A range end as an int; `unbounded` for torch's int_oo or sympy's oo (a Dim without max=):
    int() of either raises AttributeError "'Infinity' object has no attribute '_mpf_'"."""
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return unbounded


def _dim_name(d) -> str:
    """The name the user gave the dimension (torch.export.Dim("seq")), else torch's symbol (s27)."""
    node = d.node
    env = getattr(node, "shape_env", None)
    names = getattr(env, "source_name_to_debug_name", None) or {}
    for src in getattr(env, "var_to_sources", {}).get(node.expr, []):
        key = src.name() if callable(getattr(src, "name", None)) else getattr(src, "name", None)
        if names.get(key):
            return names[key]
    return str(node.expr)


def _json_value(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return repr(v)


def entry_signature(ep: torch.export.ExportedProgram, function: str) -> dict:
    """Inputs (flattened, with pytree paths), outputs and the output structure of one entry point."""
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    in_spec = ep.call_spec.in_spec
    if in_spec is not None:
        indices = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
        paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(indices)[0]]
    else:
        paths = [f"[0][{i}]" for i in range(len(user_specs))]
    if len(paths) != len(user_specs):
        raise CompileError(f"{function}: {len(paths)} flattened inputs but {len(user_specs)} user inputs in the graph")

    inputs = []
    for path, spec in zip(paths, user_specs):
        if isinstance(spec.arg, ConstantArgument):
            inputs.append({"path": path, "name": spec.arg.name, "kind": "constant", "value": _json_value(spec.arg.value)})
            continue
        val = placeholders[spec.arg.name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise CompileError(
                f"{function}: input {path} is a {type(val).__name__} that stays symbolic after export; "
                "only tensors and constant Python values are supported as inputs"
            )
        inputs.append(
            {"path": path, "name": spec.arg.name, "kind": "tensor", "dtype": _dtype_name(val.dtype), "shape": [_dim(d, ep) for d in val.shape]}
        )

    producers = {n.name: n for n in ep.graph.nodes}
    leaves = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            continue  # buffer mutations are state, never outputs
        if isinstance(spec.arg, ConstantArgument):
            leaves.append({"type": "constant", "value": _json_value(spec.arg.value)})
            continue
        val = producers[spec.arg.name].meta.get("val")
        scalar = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}.get(type(val))
        if scalar is not None:
            # A Python number the program computes (x.item(), a size): IREE returns it as a scalar,
            # the runtime gives it back as that Python type.
            leaves.append({"type": "scalar", "python": scalar})
            continue
        if not isinstance(val, torch.Tensor):
            raise CompileError(f"{function}: output {spec.arg.name} is not a tensor ({type(val).__name__})")
        leaves.append({"type": "tensor", "dtype": _dtype_name(val.dtype), "shape": [_dim(d, ep) for d in val.shape]})

    structure = _structure(ep.call_spec.out_spec, iter(leaves)) if ep.call_spec.out_spec is not None else {
        "type": "tuple",
        "children": leaves,
    }
    return {"function": function, "inputs": inputs, "outputs": structure}


def _structure(ts, leaves):
    if ts.is_leaf():
        return next(leaves)
    children = [ts.child(i) for i in range(ts.num_children)]
    if ts.type is type(None):
        return {"type": "none"}
    built = [_structure(c, leaves) for c in children]
    if ts.type is list:
        return {"type": "list", "children": built}
    if isinstance(ts.context, (list, tuple)) and all(isinstance(k, str) for k in ts.context) and len(ts.context) == len(built) and ts.type is not tuple and not hasattr(ts.type, "_fields"):
        # dict, OrderedDict and dict-like model outputs (e.g. transformers' ModelOutput)
        return {"type": "dict", "keys": list(ts.context), "children": built}
    return {"type": "tuple", "children": built}
