"""How a compiled output is measured against eager PyTorch's: the tolerance profiles and the checks.

Every output gets max abs error, max relative error and cosine; a logits output (one whose manifest
spec has `"role": "logits"`, or that the user names with `--logits`) also gets top-1 / top-k
agreement and KL divergence. The `OutputDiff` records made here are what `llmc diff`
(compiler/diff.py, compiler/diff_llm.py), per-layer localisation (compiler/per_layer.py), bisect's
drift check and the report (compiler/report.py) are built on.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from llmc.errors import UsageError

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
    # fp8 weights (E4M3, 3 mantissa bits, per-channel scales) against eager in the compute dtype with
    # the original weights: the quantization error itself, so looser than any float dtype. Near-tied
    # logits may change their argmax (tiny Llama: 1 of 9 rows with the embedding in fp8 too), so top-1
    # is not a criterion here; the tokens are checked against eager on the same quantized weights.
    "fp8": {"max_rel": 0.25, "min_cosine": 0.99, "min_top1": 0.0, "max_kl": 0.1},
    # int8 weights (symmetric, one scale per output row: error uniform in +-s/2, s = amax/127, std
    # ~amax/440, about 1% of a Gaussian row's rms where E4M3's relative 2^-4 step gives ~3.6%): the
    # same reasoning as fp8 at about a quarter of its error. Tiny Llama (17-token prompt + 8 steps,
    # embedding in int8 too): worst max_rel 0.036, cosine 0.9996, KL 2.2e-4 (fp8: 0.12, 0.993).
    "int8": {"max_rel": 0.1, "min_cosine": 0.998, "min_top1": 0.0, "max_kl": 0.01},
    # f32 math over a KV cache stored in bf16 (--kv-dtype bf16), against eager with the same bf16 cache:
    # the f32 arithmetic differs in the last bits, and a K/V value that close to a bf16 rounding boundary
    # rounds the other way on one side (one bf16 step, 2^-8 relative, in a few elements). Measured worst
    # (`llmc diff --steps 10-12`, 8 seeds tiny, 3 seeds small-125m): max_rel 3e-4, cosine 0.99999999, KL
    # 1e-8; eager with an f32 cache is 1.5-3e-3 away (docs/targets.md "bf16 KV cache").
    "kv-bf16": {"max_rel": 2e-3, "min_cosine": 0.99999, "min_top1": 0.99, "max_kl": 1e-6},
}


def profile_for(dtype: str, kv_narrowed: bool) -> str:
    """The tolerance profile llmc diff judges a module of --dtype `dtype` by: its own, or kv-bf16 where the
    cache was narrowed to bf16 and the dtype's profile is tighter (f32 math)."""
    if kv_narrowed and TOLERANCES.get(dtype, TOLERANCES["f32"])["max_rel"] < TOLERANCES["kv-bf16"]["max_rel"]:
        return "kv-bf16"
    return dtype


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
