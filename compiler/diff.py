"""Compare a compiled module with eager PyTorch on the same inputs (`llmc diff`, the CI stage).

Inputs are drawn from the manifest's signature with a fixed seed, or read from an .npz file whose
keys name the signature's inputs. Eager PyTorch runs the same model in the artifact's dtype, and
every output is compared against the tolerance profile of that dtype: max abs error, max relative
error and cosine for every output; top-1 / top-k agreement and KL divergence for logits outputs
(an output whose manifest spec has `"role": "logits"`, or that the user names with `--logits`).

The report (compiler/report.py) and per-layer localisation (compiler/per_layer.py) build on the
`OutputDiff` records made here.
"""

from __future__ import annotations

import dataclasses
import math
import zipfile
from pathlib import Path

import numpy as np
import torch

from llmc.compiler import export
from llmc.errors import LlmcError, UsageError

# Tolerance profiles, one per compute dtype, derived from each format's precision.
#  - f32: unit roundoff 2^-24 ~ 6e-8; reductions of length K in a different order than eager's
#    kernels add ~sqrt(K) ulps, so 1e-5 relative to the output's max magnitude leaves headroom for
#    K in the thousands without hiding a real error (a wrong op is off by O(1)).
#  - f16: unit roundoff 2^-11 ~ 4.9e-4; both sides round intermediate results, so the comparison
#    is statistical: cosine >= 0.999 and max error <= 2% of the output's magnitude.
#  - bf16: unit roundoff 2^-8 ~ 3.9e-3, eight times f16's: cosine >= 0.999 (issue acceptance),
#    max error <= 5% of the output's magnitude.
#
# Logits outputs are also checked for the decision they drive (the next token) and for the
# distribution they define. Both limits come from a logit error d = got - ref:
#  - max_kl, KL(eager || compiled) over the last dim, mean over rows. To second order in d,
#    KL(p || q) = 1/2 Var_p(d) <= 1/2 E_p[d^2]. With a per-logit error of about c*u*|z| (u the unit
#    roundoff, c ~ 8 roundings along the path into the logits, |z| ~ 10 for an LLM's top logits):
#      f32:  d ~ 8 * 6e-8  * 10 = 5e-6 -> KL ~ 1e-11; limit 1e-6 (the f32 max_rel of 1e-5 on
#            |z| ~ 30 gives d <= 3e-4, KL <= 5e-8: 1e-6 still flags any real error)
#      f16:  d ~ 8 * 4.9e-4 * 10 = 0.04 -> KL ~ 8e-4; limit 1e-3
#      bf16: d ~ 8 * 3.9e-3 * 10 = 0.31 -> KL ~ 5e-2; limit 5e-2
#  - min_top1, the fraction of rows whose argmax agrees. A row flips when its top-two gap is below
#    ~2|d|. For V logits the top-two gap of near-Gaussian logits is roughly exponential with mean
#    sigma / sqrt(2 ln V) (~sigma / 4.5 for V = 32000), so P(flip) ~ 2|d| * 4.5 / sigma; with
#    |d| ~ c*u*|z| and |z| / sigma ~ 4.5: P(flip) ~ 40 * c * u:
#      f32:  40 * 8 * 6e-8  = 2e-5  -> min_top1 0.99 (any real error flips far more)
#      f16:  40 * 8 * 4.9e-4 = 0.16 for near-uniform logits; trained LLMs have far larger gaps
#            than random logits -> min_top1 0.9
#      bf16: the same bound exceeds 1 for near-uniform logits: a random model's argmax is noise
#            in bf16; trained models keep ~90%+ -> min_top1 0.8
#    Top-k agreement (overlap of the k best tokens) is reported, not checked.
TOLERANCES = {
    "f32": {"max_rel": 1e-5, "min_cosine": 0.99999, "min_top1": 0.99, "max_kl": 1e-6},
    "f16": {"max_rel": 2e-2, "min_cosine": 0.999, "min_top1": 0.9, "max_kl": 1e-3},
    "bf16": {"max_rel": 5e-2, "min_cosine": 0.999, "min_top1": 0.8, "max_kl": 5e-2},
}
# What each key means (for --tolerance and the report schema).
TOLERANCE_KEYS = {
    "max_rel": "max |compiled - eager| / max |eager| must not exceed this",
    "min_cosine": "cosine similarity of the flattened outputs must be at least this",
    "min_top1": "logits only: fraction of rows whose argmax agrees must be at least this",
    "max_kl": "logits only: KL(eager || compiled) over the last dim, mean over rows, must not exceed this",
}
DEFAULT_TOP_K = 5


def parse_tolerance(text: str | None) -> dict:
    """The overrides in `max_rel=1e-4,min_cosine=0.999` (applied over a profile). Raises UsageError."""
    overrides = {}
    for item in (p.strip() for p in (text or "").split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise UsageError(f"--tolerance {text!r}: {item!r} is not KEY=VALUE; e.g. --tolerance max_rel=1e-4,min_cosine=0.999")
        if key not in TOLERANCE_KEYS:
            raise UsageError(f"--tolerance {text!r}: unknown key {key!r}; known keys: {', '.join(TOLERANCE_KEYS)}")
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--tolerance {text!r}: {key}={value.strip()!r} is not a number") from None
        if math.isnan(number):
            raise UsageError(f"--tolerance {text!r}: {key} must be a number, not nan")
        overrides[key] = number
    return overrides


@dataclasses.dataclass
class LogitsDiff:
    top1: float  # fraction of rows whose argmax agrees
    topk: float  # mean over rows of |top-k(eager) & top-k(compiled)| / k
    k: int
    kl: float  # KL(eager || compiled) over the last dim, mean over rows
    rows: int


@dataclasses.dataclass
class OutputDiff:
    name: str
    shape: list
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool
    reason: str = ""
    dtype: str = ""
    logits: LogitsDiff | None = None
    # max over the checks of how far the measurement is toward its limit (1.0 = at the limit);
    # the output with the highest severity is the "worst" one.
    severity: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def logits_metrics(got: torch.Tensor, ref: torch.Tensor, k: int = DEFAULT_TOP_K) -> LogitsDiff:
    """Top-1 / top-k agreement and KL(eager || compiled) over the last dim, rows = all other dims."""
    vocab = ref.shape[-1] if ref.dim() else 1
    g = got.detach().double().reshape(-1, vocab)
    r = ref.detach().double().reshape(-1, vocab)
    rows = r.shape[0]
    if rows == 0 or vocab == 0:
        return LogitsDiff(1.0, 1.0, k, 0.0, rows)
    top1 = (g.argmax(-1) == r.argmax(-1)).double().mean().item()
    kk = max(1, min(k, vocab))
    tg, tr = g.topk(kk, dim=-1).indices, r.topk(kk, dim=-1).indices
    overlap = (tr[:, :, None] == tg[:, None, :]).any(-1).sum(-1).double() / kk
    log_p, log_q = torch.log_softmax(r, -1), torch.log_softmax(g, -1)
    p = log_p.exp()
    # p * (log p - log q), with 0 * anything = 0 where eager gives a token no mass (masked logits).
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    kl = terms.sum(-1).mean().item()
    if math.isnan(kl):
        kl = math.inf
    return LogitsDiff(top1, overlap.mean().item(), kk, max(kl, 0.0), rows)


def _ratio(value: float, limit: float) -> float:
    if value <= 0:
        return 0.0
    return value / limit if limit > 0 else math.inf


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, tol: dict, *, logits: bool = False, top_k: int = DEFAULT_TOP_K) -> OutputDiff:
    """max_rel = max|got - ref| / max|ref| (the error relative to the output's scale)."""
    dtype = str(ref.dtype).removeprefix("torch.")
    fail = lambda reason: OutputDiff(name, list(ref.shape), math.inf, math.inf, 0.0, False, reason, dtype, None, math.inf)
    if tuple(got.shape) != tuple(ref.shape):
        return fail(f"shape {list(got.shape)} != eager's {list(ref.shape)}")
    if not ref.is_floating_point():
        if torch.equal(got, ref):
            return OutputDiff(name, list(ref.shape), 0.0, 0.0, 1.0, True, "", dtype)
        return fail("integer outputs differ")
    g, r = got.double().flatten(), ref.double().flatten()
    if not torch.isfinite(g).all() or not torch.isfinite(r).all():
        ok = torch.equal(torch.isnan(g), torch.isnan(r)) and torch.equal(g[~torch.isfinite(g)], r[~torch.isfinite(r)])
        fin = torch.isfinite(g) & torch.isfinite(r)
        if not ok:
            return fail("non-finite values differ")
        g, r = g[fin], r[fin]
    lg = logits_metrics(got, ref, top_k) if logits else None
    if g.numel() == 0:
        return OutputDiff(name, list(ref.shape), 0.0, 0.0, 1.0, True, "", dtype, lg)
    max_abs = (g - r).abs().max().item()
    scale = r.abs().max().item()
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    denom = (g.norm() * r.norm()).item()
    cosine = (g @ r).item() / denom if denom > 0 else (1.0 if max_abs == 0 else 0.0)
    reasons = []
    if max_rel > tol["max_rel"]:
        reasons.append(f"max_rel {max_rel:.3g} > {tol['max_rel']:g}")
    if cosine < tol["min_cosine"]:
        reasons.append(f"cosine {cosine:.6f} < {tol['min_cosine']:g}")
    severity = max(_ratio(max_rel, tol["max_rel"]), _ratio(1 - cosine, 1 - tol["min_cosine"]))
    if lg is not None:
        if lg.top1 < tol["min_top1"]:
            reasons.append(f"top-1 agreement {lg.top1:.4f} < {tol['min_top1']:g}")
        if lg.kl > tol["max_kl"]:
            reasons.append(f"KL {lg.kl:.3g} > {tol['max_kl']:g}")
        severity = max(severity, _ratio(1 - lg.top1, 1 - tol["min_top1"]), _ratio(lg.kl, tol["max_kl"]))
    return OutputDiff(name, list(ref.shape), max_abs, max_rel, cosine, not reasons, "; ".join(reasons), dtype, lg, severity)


def _leaf_specs(structure: dict, prefix: str = "out") -> list[tuple[str, dict]]:
    kind = structure["type"]
    if kind == "tensor":
        return [(prefix, structure)]
    if kind in ("tuple", "list"):
        return [p for i, c in enumerate(structure["children"]) for p in _leaf_specs(c, f"{prefix}[{i}]")]
    if kind == "dict":
        return [p for k, c in zip(structure["keys"], structure["children"]) for p in _leaf_specs(c, f"{prefix}[{k!r}]")]
    return []


def _leaf_paths(structure: dict, prefix: str = "out") -> list[str]:
    return [p for p, _ in _leaf_specs(structure, prefix)]


def logits_outputs(structure: dict, requested: list[str] | tuple[str, ...] = ()) -> set[str]:
    """Names of the outputs to check as logits: role "logits" in the manifest, plus `requested`."""
    specs = _leaf_specs(structure)
    names = [p for p, _ in specs]
    unknown = [n for n in requested if n not in names]
    if unknown:
        raise UsageError(f"--logits {unknown[0]}: no such output; the outputs are {', '.join(names) or '(none)'}")
    for n in requested:
        dt = dict(specs)[n].get("dtype", "")
        if not dt.startswith(("float", "bfloat")):
            raise UsageError(f"--logits {n}: that output is {dt}, logits must be a floating-point output")
    return {p for p, s in specs if s.get("role") == "logits"} | set(requested)


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


def _shape_text(shape: list) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else f"{d['name']}:{d['min']}..{d['max']}" for d in shape) + "]"


def load_inputs(path: Path, entry: dict, aliases: dict | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) from an .npz file whose keys are the entry's input paths ("[0][0]") or names ("x").

    aliases: more accepted names, {name: path} (the model's own input names).
    Every tensor input must be present once, with the signature's dtype and a shape in range;
    constant inputs (folded at compile time) take their compiled value and must not be given.
    Raises UsageError naming the file and the key.
    """
    import ml_dtypes

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
        if e["dtype"] == "bfloat16" and arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
            arr = arr.view(ml_dtypes.bfloat16)  # numpy stores ml_dtypes' bfloat16 as raw 2-byte voids
        got_dtype = "bfloat16" if arr.dtype == ml_dtypes.bfloat16 else str(arr.dtype)
        if got_dtype != e["dtype"]:
            raise UsageError(f"{where}: key {key!r} is {got_dtype}, the module takes {e['dtype']}; save it with .astype(numpy.{e['dtype']})")
        if not _shape_ok(list(arr.shape), e["shape"]):
            raise UsageError(f"{where}: key {key!r} has shape {list(arr.shape)}, the module takes {_shape_text(e['shape'])}")
        if got_dtype == "bfloat16":
            t = torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.array(arr))
        leaves.append((e["path"], t))
    return _rebuild(leaves)


def eager_reference(ep, dtype: str):
    """A callable running the exported program eagerly in the artifact's dtype."""
    module = ep.module()
    if dtype != "f32":
        tdt = export.TORCH_DTYPES[dtype]
        # The same graph rewrite the compile path applies (export.retarget_graph), so both sides agree.
        module = export.CastInputs(export.convert_module(export.retarget_graph(module), tdt), tdt)
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


def diff_outputs(
    structure: dict, got, ref, dtype: str, tol: dict | None = None, *, logits: set[str] | frozenset = frozenset(), top_k: int = DEFAULT_TOP_K
) -> list[OutputDiff]:
    tol = tol or TOLERANCES[dtype]
    names = _leaf_paths(structure)
    got_l, ref_l = tensor_leaves(got), tensor_leaves(ref)
    if len(got_l) != len(ref_l):
        return [OutputDiff("out", [], math.inf, math.inf, 0.0, False, f"{len(got_l)} outputs vs eager's {len(ref_l)}", severity=math.inf)]
    names = names if len(names) == len(ref_l) else [f"out[{i}]" for i in range(len(ref_l))]
    return [compare(n, g, r, tol, logits=n in logits, top_k=top_k) for n, g, r in zip(names, got_l, ref_l)]


def worst(results: list[OutputDiff]) -> OutputDiff | None:
    """The failing output furthest over its limits, else the passing one closest to them."""
    if not results:
        return None
    return max(results, key=lambda r: (not r.passed, r.severity, r.max_rel))


def describe(r: OutputDiff) -> str:
    """One line of measurements: `max_abs 1e-06, max_rel 2e-07, cosine 1.0000000; top-1 1.000, ...`."""
    text = f"max_abs {r.max_abs:.3g}, max_rel {r.max_rel:.3g}, cosine {r.cosine:.7f}"
    if r.logits is not None:
        lg = r.logits
        text += f"; top-1 {lg.top1:.4f}, top-{lg.k} {lg.topk:.4f}, KL {lg.kl:.3g} ({lg.rows} rows)"
    return text


def result_line(r: OutputDiff) -> str:
    """One printed line per output: status, name, shape, dtype, the measurements, why it failed."""
    return f"{'ok  ' if r.passed else 'FAIL'} {r.name} {r.shape} {r.dtype}: {describe(r)}" + (f"  ({r.reason})" if r.reason else "")


# ---------------------------------------------------------------------------------------------
# The whole `llmc diff` run: options in, report and printed lines out (the CLI writes the files).


@dataclasses.dataclass
class DiffOptions:
    model: Path
    artifact: Path | None = None  # None: compile `model` first (target/dtype/arch, into `output` or a temp dir)
    target: str | None = None
    dtype: str | None = None
    arch: str | None = None
    output: Path | None = None
    inputs: Path | None = None  # an .npz file; None: seeded random inputs
    seed: int = 0
    seq: int | None = None
    profile: str = "auto"
    tolerance: str | None = None  # "max_rel=1e-4,min_cosine=0.999"
    logits: tuple[str, ...] = ()
    top_k: int = DEFAULT_TOP_K
    per_layer: bool = False
    per_layer_depth: int | None = None
    repro_dir: Path | None = None
    verbose: bool = False
    steps: int | None = None  # language-model artifacts: greedy decode steps after the prompt


@dataclasses.dataclass
class DiffOutcome:
    passed: bool
    report: dict  # format llmc-diff-report/1 (compiler/report.py)
    lines: list[str]  # what the CLI prints, the verdict last


def _check_options(o: DiffOptions) -> dict:
    """Everything that can be checked before loading anything; returns the --tolerance overrides."""
    if not o.model.exists():
        raise UsageError(f"{o.model}: no such file")
    if o.artifact is not None:
        if not o.artifact.exists():
            raise UsageError(f"{o.artifact}: no such file")
        if o.output is not None:
            raise UsageError(f"-o {o.output}: -o names the module to compile; with an artifact given there is nothing to compile")
    if o.top_k < 1:
        raise UsageError(f"--top-k {o.top_k}: must be at least 1")
    if o.per_layer_depth is not None and o.per_layer_depth < 1:
        raise UsageError(f"--per-layer-depth {o.per_layer_depth}: must be at least 1 (1 = the modules the model calls directly)")
    if o.profile != "auto" and o.profile not in TOLERANCES:
        raise UsageError(f"--tolerance-profile={o.profile}: choose one of auto, {', '.join(TOLERANCES)}")
    if o.inputs is not None and not o.inputs.exists():
        raise UsageError(f"--inputs {o.inputs}: no such file")
    return parse_tolerance(o.tolerance)


def _check_against_manifest(o: DiffOptions, manifest: dict) -> None:
    t = manifest["target"]
    for flag, given, built in (("--target", o.target, t["name"]), ("--dtype", o.dtype, manifest["dtype"]), ("--arch", o.arch, t.get("arch"))):
        if given is not None and given != built:
            raise UsageError(
                f"{flag}={given}: {o.artifact} was compiled with {flag}={built}; drop {flag} to diff it as built, "
                f"or leave out the artifact to compile {o.model.name} with {flag}={given} first"
            )


def _check_signatures(model: Path, artifact: Path, pt2_sig: dict, entry: dict) -> None:
    """The artifact's inputs must be the model's (same paths, dtypes and ranks)."""
    ours = {e["path"]: e for e in pt2_sig["inputs"]}
    for e in entry["inputs"]:
        m = ours.get(e["path"])
        if m is None:
            raise UsageError(f"{artifact} takes input {e['path']} that {model} does not; diff the artifact against the model it was compiled from")
        if e["kind"] != m["kind"] or (e["kind"] == "tensor" and (len(e["shape"]) != len(m["shape"]) or e["dtype"] != m["dtype"])):
            mine = f"{m['dtype']}{_shape_text(m['shape'])}" if m["kind"] == "tensor" else f"constant {m.get('value')!r}"
            theirs = f"{e['dtype']}{_shape_text(e['shape'])}" if e["kind"] == "tensor" else f"constant {e.get('value')!r}"
            raise UsageError(
                f"{artifact} takes input {e['path']} as {theirs} but {model} as {mine}; "
                "diff the artifact against the model it was compiled from"
            )
    extra = [p for p in ours if p not in {e["path"] for e in entry["inputs"]}]
    if extra:
        raise UsageError(f"{model} takes input {extra[0]} that {artifact} does not; diff the artifact against the model it was compiled from")


def _aliases(pt2_sig: dict, entry: dict) -> dict:
    """The .pt2's own input names (the user's), which re-export may rename (`x` -> `args_0`)."""
    by_path = {e["path"]: e for e in entry["inputs"]}
    return {e["name"]: e["path"] for e in pt2_sig["inputs"] if e.get("name") and e["path"] in by_path}


def run(o: DiffOptions) -> DiffOutcome:
    """Compile (if no artifact is given), run eager and compiled on the same inputs, compare, localise."""
    import warnings

    with warnings.catch_warnings():
        # torch deep-copies its own tree specs (export, decompositions, convert_module) and warns
        # about its own deprecated LeafSpec API each time: noise between the diff's lines.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        return _run(o)


def _run(o: DiffOptions) -> DiffOutcome:
    import contextlib
    import tempfile
    import time

    from llmc.compiler import artifacts, report
    from llmc.runtime import load

    overrides = _check_options(o)
    from llmc.compiler import llm

    if o.model.suffix != ".pt2" and llm.is_llama_checkpoint(o.model):
        from llmc.compiler import diff_llm

        return diff_llm.run(o, overrides)
    if o.steps is not None:
        raise UsageError(f"--steps: applies to language-model checkpoints; {o.model} is not one")
    if o.artifact is None:
        from llmc.compiler import targets

        targets.resolve(o.target or "cpu", o.arch, o.dtype or "f32")  # bad flags fail before any work
    ep = export.load_pt2(o.model)
    pt2_sig = artifacts.entry_signature(ep, "main")

    with contextlib.ExitStack() as stack:
        scratch = lambda: Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmc-diff-")))
        repro_dir = o.repro_dir or Path.cwd()
        if o.artifact is None:
            from llmc.compiler.api import compile_model

            if o.inputs is not None:
                load_inputs(o.inputs, pt2_sig)  # a bad file fails before the compile, not after
            output = o.output if o.output is not None else scratch() / f"{o.model.stem}.vmfb"
            art = compile_model(
                o.model, target=o.target or "cpu", dtype=o.dtype or "f32", arch=o.arch, output=output,
                repro_dir=o.repro_dir or (None if o.output is not None else repro_dir), quiet=not o.verbose,
            )
            vmfb = art.vmfb
        else:
            vmfb = o.artifact
        mod = load(vmfb)
        manifest = mod.manifest
        if o.artifact is not None:
            _check_against_manifest(o, manifest)
        entry_name = mod.default_entry
        entry = manifest["entry_points"][entry_name]
        _check_signatures(o.model, vmfb, pt2_sig, entry)
        dtype = manifest["dtype"]
        profile = dtype if o.profile == "auto" else o.profile
        if profile not in TOLERANCES:
            raise UsageError(f"{vmfb}: no tolerance profile for dtype {dtype}; pass --tolerance-profile ({', '.join(TOLERANCES)})")
        tol = {**TOLERANCES[profile], **overrides}
        logits = logits_outputs(entry["outputs"], o.logits)
        if o.inputs is not None:
            args, kwargs = load_inputs(o.inputs, entry, _aliases(pt2_sig, entry))
        else:
            args, kwargs = random_inputs(entry, o.seed, int_high(ep), o.seq)

        start = time.perf_counter()
        ref = run_eager(eager_reference(ep, dtype), args, kwargs)
        got = mod(*args, **kwargs)
        seconds = time.perf_counter() - start
        results = diff_outputs(entry["outputs"], got, ref, dtype, tol, logits=logits, top_k=o.top_k)
        bad = worst(results)

        pl = None
        if o.per_layer or o.per_layer_depth is not None:
            from llmc.compiler import per_layer

            pl = per_layer.localise(
                ep, mod, args, kwargs, tol, depth=o.per_layer_depth, workdir=scratch(), repro_dir=repro_dir, quiet=not o.verbose
            )

    passed = all(r.passed for r in results)
    lines = [result_line(r) for r in results]
    if pl is not None:
        lines.extend(_per_layer_lines(pl, o.verbose))
    n_fail = sum(not r.passed for r in results)
    if passed:
        summary = f"PASS: {len(results)} output(s), tolerance profile {profile}" + (f", worst {bad.name}" if bad else "")
    else:
        summary = f"FAIL: {n_fail} of {len(results)} output(s) over tolerance (profile {profile}); worst {bad.name}: {bad.reason}"
        if pl is not None:
            summary += f"; first divergent module: {pl.first.probe.module}" if pl.first else "; no module output over tolerance"
    lines.append(summary)
    entries = [report.entry_record(entry_name, results, bad, seconds, pl)]
    rep = report.build_report(
        summary=summary, model=str(o.model), artifact=str(vmfb), compiled_by_diff=o.artifact is None, manifest=manifest,
        profile=profile, tolerance=tol, overrides=overrides,
        inputs={"source": "file" if o.inputs else "random", "seed": None if o.inputs else o.seed, "file": str(o.inputs) if o.inputs else None},
        entries=entries,
    )
    return DiffOutcome(passed, rep, lines)


def _per_layer_lines(pl, verbose: bool) -> list[str]:
    depth = "every depth" if pl.depth is None else f"depth <= {pl.depth}"
    lines = [f"per-layer: {len(pl.modules)} module output(s) compared ({depth}), compiled with {pl.params or 'no parameters'}"]
    for m in pl.modules if verbose else []:
        d = m.diff
        lines.append(f"  {'ok  ' if d.passed else 'FAIL'} {m.probe.module} ({m.probe.type.rsplit('.', 1)[-1]}): {describe(d)}")
    if pl.first is None:
        lines.append("per-layer: no module output over tolerance")
    else:
        p, d = pl.first.probe, pl.first.diff
        where = f" at {p.source}: {p.code}" if p.source else ""
        lines.append(f"per-layer: first divergence: {p.module} ({p.type.rsplit('.', 1)[-1]}): {d.reason}{where}")
    return lines
