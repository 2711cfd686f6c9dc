"""Compare a compiled module with eager PyTorch on the same seeded inputs.

This is the first cut of the CI stage (`llmc diff MODEL OUT.vmfb`): inputs are drawn from the
manifest's signature with a fixed seed, eager PyTorch runs the same model in the artifact's dtype,
and every output is compared (max abs error, max relative error, cosine) against the tolerance
profile of that dtype. Reports, JUnit and per-layer localisation are a separate issue.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from llmc.compiler import export

# Tolerance profiles, one per compute dtype, derived from each format's precision.
#  - f32: unit roundoff 2^-24 ~ 6e-8; reductions of length K in a different order than eager's
#    kernels add ~sqrt(K) ulps, so 1e-5 relative to the output's max magnitude leaves headroom for
#    K in the thousands without hiding a real error (a wrong op is off by O(1)).
#  - f16: unit roundoff 2^-11 ~ 4.9e-4; both sides round intermediate results, so the comparison
#    is statistical: cosine >= 0.999 and max error <= 2% of the output's magnitude.
#  - bf16: unit roundoff 2^-8 ~ 3.9e-3, eight times f16's: cosine >= 0.999 (issue acceptance),
#    max error <= 5% of the output's magnitude.
TOLERANCES = {
    "f32": {"max_rel": 1e-5, "min_cosine": 0.99999},
    "f16": {"max_rel": 2e-2, "min_cosine": 0.999},
    "bf16": {"max_rel": 5e-2, "min_cosine": 0.999},
}


@dataclasses.dataclass
class OutputDiff:
    name: str
    shape: list
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool
    reason: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, tol: dict) -> OutputDiff:
    """max_rel = max|got - ref| / max|ref| (the error relative to the output's scale)."""
    if tuple(got.shape) != tuple(ref.shape):
        return OutputDiff(name, list(ref.shape), math.inf, math.inf, 0.0, False, f"shape {list(got.shape)} != {list(ref.shape)}")
    if not ref.is_floating_point():
        same = torch.equal(got, ref)
        return OutputDiff(name, list(ref.shape), 0.0 if same else math.inf, 0.0 if same else math.inf, 1.0 if same else 0.0, same, "" if same else "integer outputs differ")
    g, r = got.double().flatten(), ref.double().flatten()
    if not torch.isfinite(g).all() or not torch.isfinite(r).all():
        ok = torch.equal(torch.isnan(g), torch.isnan(r)) and torch.equal(g[~torch.isfinite(g)], r[~torch.isfinite(r)])
        fin = torch.isfinite(g) & torch.isfinite(r)
        if not ok:
            return OutputDiff(name, list(ref.shape), math.inf, math.inf, 0.0, False, "non-finite values differ")
        g, r = g[fin], r[fin]
    if g.numel() == 0:
        return OutputDiff(name, list(ref.shape), 0.0, 0.0, 1.0, True)
    max_abs = (g - r).abs().max().item()
    scale = r.abs().max().item()
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    denom = (g.norm() * r.norm()).item()
    cosine = (g @ r).item() / denom if denom > 0 else (1.0 if max_abs == 0 else 0.0)
    reasons = []
    if max_rel > tol["max_rel"]:
        reasons.append(f"max_rel {max_rel:.3g} > {tol['max_rel']:g}")
    if cosine < tol["min_cosine"]:
        reasons.append(f"cosine {cosine:.6f} < {tol['min_cosine']}")
    return OutputDiff(name, list(ref.shape), max_abs, max_rel, cosine, not reasons, "; ".join(reasons))


def _leaf_paths(structure: dict, prefix: str = "out") -> list[str]:
    kind = structure["type"]
    if kind == "tensor":
        return [prefix]
    if kind in ("tuple", "list"):
        return [p for i, c in enumerate(structure["children"]) for p in _leaf_paths(c, f"{prefix}[{i}]")]
    if kind == "dict":
        return [p for k, c in zip(structure["keys"], structure["children"]) for p in _leaf_paths(c, f"{prefix}[{k!r}]")]
    return []


def tensor_leaves(value) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    if hasattr(value, "to_tuple") and not isinstance(value, (tuple, list, dict)):
        value = dict(value)
    return [x for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]


def int_high(ep) -> int:
    """Upper bound for random integer inputs: the smallest embedding table's row count (16 if none)."""
    highs = []
    for n in ep.graph.nodes:
        if n.op == "call_function" and "embedding" in str(n.target):
            w = n.args[0].meta.get("val") if hasattr(n.args[0], "meta") else None
            if isinstance(w, torch.Tensor):
                highs.append(int(w.shape[0]))
    return min(highs) if highs else 16


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
    # Rebuild (args, kwargs) from the flattened paths: "[0][i]" positional, "[1]['k']" keyword.
    args, kwargs = [], {}
    for path, v in leaves:
        if path.startswith("[0]"):
            args.append(v)
        else:
            key = path[len("[1]['") : -2]
            kwargs[key] = v
    return tuple(args), kwargs


def eager_reference(ep, dtype: str):
    """A callable running the exported program eagerly in the artifact's dtype."""
    module = ep.module()
    if dtype != "f32":
        tdt = export.TORCH_DTYPES[dtype]
        module = export.CastInputs(export.convert_module(module, tdt), tdt)
    return module


def diff_outputs(structure: dict, got, ref, dtype: str, tol: dict | None = None) -> list[OutputDiff]:
    tol = tol or TOLERANCES[dtype]
    names = _leaf_paths(structure)
    got_l, ref_l = tensor_leaves(got), tensor_leaves(ref)
    if len(got_l) != len(ref_l):
        return [OutputDiff("out", [], math.inf, math.inf, 0.0, False, f"{len(got_l)} outputs vs eager's {len(ref_l)}")]
    names = names if len(names) == len(ref_l) else [f"out[{i}]" for i in range(len(ref_l))]
    return [compare(n, g, r, tol) for n, g, r in zip(names, got_l, ref_l)]
