"""llmc.compiler.diff_metrics, diff_inputs and per_layer without compiling: tolerance overrides, logits metrics, input
files, the worst output, and which module outputs per-layer localisation probes.

Numbers checked here are computed independently in the test (numpy, forward hooks), never copied
from the code under test.
"""

from __future__ import annotations

import inspect
import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn as nn

from llmc.compiler import diff_inputs, diff_metrics, per_layer
from llmc.errors import UsageError

F32 = diff_metrics.TOLERANCES["f32"]


# --- tolerance overrides ------------------------------------------------------------------------


def test_parse_tolerance_reads_every_key():
    got = diff_metrics.parse_tolerance("max_rel=1e-4, min_cosine=0.999,min_top1=0.5,max_kl=2e-3")
    assert got == {"max_rel": 1e-4, "min_cosine": 0.999, "min_top1": 0.5, "max_kl": 2e-3}
    assert diff_metrics.parse_tolerance(None) == {}


@pytest.mark.parametrize(
    "text,names",
    [
        ("max_err=1e-4", ["max_err", "max_rel"]),  # unknown key; the message lists the known ones
        ("max_rel=tiny", ["max_rel", "tiny", "not a number"]),
        ("max_rel", ["max_rel", "KEY=VALUE"]),
        ("max_rel=nan", ["max_rel", "nan"]),
    ],
)
def test_parse_tolerance_rejects(text, names):
    with pytest.raises(UsageError) as e:
        diff_metrics.parse_tolerance(text)
    msg = str(e.value)
    assert msg.startswith("--tolerance") and "\n" not in msg
    for n in names:
        assert n in msg


# --- logits metrics -----------------------------------------------------------------------------


def _kl_numpy(ref: np.ndarray, got: np.ndarray) -> float:
    """KL(softmax(ref) || softmax(got)) per row, mean over rows, straight from the definition."""
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = np.exp(got - got.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    return float(np.mean(np.sum(p * np.log(p / q), -1)))


def test_logits_metrics_hand_computed():
    ref = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 0.0]])
    got = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 5.0]])
    m = diff_metrics.logits_metrics(got, ref, k=2)
    assert m.rows == 3 and m.k == 2
    # argmax: row 0 flips (0 -> 1), row 1 agrees, row 2 flips (0 -> 3)
    assert m.top1 == pytest.approx(1 / 3)
    # top-2 sets: row 0 {0,1} vs {1,0}: 2/2; row 1 {3,2} vs {3,2}: 2/2; row 2 {0, one of 1..3} vs {3, one of 0..2}
    row2 = len(set(ref[2].topk(2).indices.tolist()) & set(got[2].topk(2).indices.tolist())) / 2
    assert m.topk == pytest.approx((1 + 1 + row2) / 3)
    assert m.kl == pytest.approx(_kl_numpy(ref.numpy().astype(np.float64), got.numpy().astype(np.float64)), rel=1e-9)
    assert m.kl > 0.5  # row 2 moves almost all of the mass


def test_logits_metrics_over_leading_dims_and_masked_tokens():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 3, 11, generator=g)
    ref[..., 0] = -math.inf  # a masked token: no mass on either side, must not make KL nan
    got = ref.clone()
    m = diff_metrics.logits_metrics(got, ref)
    assert (m.rows, m.top1, m.topk, m.kl) == (6, 1.0, 1.0, 0.0)


def test_compare_logits_fails_on_argmax_flips_and_names_them():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(64, 100, generator=g, dtype=torch.float64).float()
    got = ref.clone()
    # Swap the best and second-best logits of 3 rows: small values change, the decision flips.
    for row in (3, 17, 40):
        top = ref[row].topk(2).indices
        got[row, top[0]], got[row, top[1]] = ref[row, top[1]], ref[row, top[0]]
    loose = {**F32, "max_rel": 1.0, "min_cosine": 0.0, "max_kl": 1.0}  # only top-1 can fail
    r = diff_metrics.compare("logits", got, ref, loose, logits=True)
    assert r.logits.top1 == pytest.approx(61 / 64)
    assert not r.passed and r.reason.startswith("top-1 agreement 0.9531 < 0.99")
    plain = diff_metrics.compare("logits", got, ref, loose)  # not logits: no top-1 check
    assert plain.passed and plain.logits is None


def test_worst_is_the_output_furthest_over_its_limit():
    ref = torch.linspace(1, 2, 100)
    a = diff_metrics.compare("a", ref + 1e-3, ref, F32)  # 1e-3 / 2 = 5e-4 relative: 50x the limit
    b = diff_metrics.compare("b", ref + 1e-1, ref, F32)  # 5e-2 relative: 5000x
    c = diff_metrics.compare("c", ref.clone(), ref, F32)
    assert not a.passed and not b.passed and c.passed
    assert a.severity == pytest.approx(5e-4 / 1e-5, rel=1e-3)
    assert diff_metrics.worst([a, c, b]).name == "b"
    assert diff_metrics.worst([c, diff_metrics.compare("d", ref * (1 + 5e-6), ref, F32)]).name == "d"  # both pass: closest to the limit


# --- input files --------------------------------------------------------------------------------

ENTRY = {
    "inputs": [
        {"path": "[0][0]", "name": "x", "kind": "tensor", "dtype": "float32", "shape": [2, {"name": "s", "min": 2, "max": 8}]},
        {"path": "[0][1]", "name": "n", "kind": "constant", "value": 3},
        {"path": "[1]['mask']", "name": "mask", "kind": "tensor", "dtype": "int64", "shape": [2]},
    ]
}


def _npz(tmp_path, **arrays):
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    return path


def test_load_inputs_by_name_path_and_alias(tmp_path):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    mask = np.array([1, 0])
    for keys in ({"x": x, "mask": mask}, {"[0][0]": x, "[1]['mask']": mask}, {"tokens": x, "mask": mask}):
        args, kwargs = diff_inputs.load_inputs(_npz(tmp_path, **keys), ENTRY, aliases={"tokens": "[0][0]"})
        assert len(args) == 2 and args[1] == 3  # the constant keeps its compiled value
        assert torch.equal(args[0], torch.from_numpy(x)) and torch.equal(kwargs["mask"], torch.from_numpy(mask))


def test_load_inputs_bf16_roundtrip(tmp_path):
    entry = {"inputs": [{"path": "[0][0]", "name": "x", "kind": "tensor", "dtype": "bfloat16", "shape": [3]}]}
    x = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)  # numpy stores this as raw 2-byte voids
    (t,), _ = diff_inputs.load_inputs(_npz(tmp_path, x=x), entry)
    assert t.dtype == torch.bfloat16 and t.float().tolist() == [1.5, -2.25, 3.0]


@pytest.mark.parametrize(
    "arrays,names",
    [
        ({"x": np.zeros((2, 5), np.float32)}, ["missing", "mask"]),
        ({"x": np.zeros((2, 5), np.float32), "mask": np.zeros(2, np.int64), "bogus": np.zeros(1)}, ["unexpected", "'bogus'", "x ([0][0])"]),
        ({"x": np.zeros((2, 5), np.float64), "mask": np.zeros(2, np.int64)}, ["'x'", "float64", "float32"]),
        ({"x": np.zeros((2, 9), np.float32), "mask": np.zeros(2, np.int64)}, ["'x'", "[2, 9]", "s:2..8"]),
        ({"x": np.zeros((2, 5), np.float32), "mask": np.zeros(3, np.int64)}, ["'mask'", "[3]"]),
        ({"x": np.zeros((2, 5), np.float32), "mask": np.zeros(2, np.int64), "n": np.array(3)}, ["'n'", "constant 3"]),
        ({"x": np.zeros((2, 5), np.float32), "[0][0]": np.zeros((2, 5), np.float32), "mask": np.zeros(2, np.int64)}, ["'x'", "'[0][0]'", "keep one"]),
    ],
    ids=["missing", "extra", "dtype", "shape-dynamic-range", "shape-static", "constant", "twice"],
)
def test_load_inputs_errors_name_the_file_and_key(tmp_path, arrays, names):
    path = _npz(tmp_path, **arrays)
    with pytest.raises(UsageError) as e:
        diff_inputs.load_inputs(path, ENTRY)
    msg = str(e.value)
    assert msg.startswith(f"--inputs {path}: ") and "\n" not in msg
    for n in names:
        assert n in msg, msg


def test_load_inputs_not_an_npz(tmp_path):
    path = tmp_path / "inputs.npz"
    path.write_bytes(b"\x93NUMPY not a zip")
    with pytest.raises(UsageError, match="not an .npz archive"):
        diff_inputs.load_inputs(path, ENTRY)


# --- per-layer probes ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d=8, h=12):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))  # PROBE-LINE


class Pair(nn.Module):
    """Returns two tensors: the one computed last is the value probed as its output."""

    def forward(self, x):
        a = x * 0.5
        b = torch.tanh(x)
        return a, b


class Counter(nn.Module):
    """Counts its calls in a buffer after computing its output: that update is state, not output."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((8,), 1.5))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        y = self.scale * x
        self.calls.add_(1)
        return y


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.pair = Pair()
        self.count = Counter()
        self.skip = nn.Identity()  # returns its input: no node of its own, nothing to probe
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        a, b = self.pair(x)
        return self.head(self.skip(self.count(a + b)))


@pytest.fixture(scope="module")
def stack():
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(2, 4, 8)
    return model, x, torch.export.export(model, (x,))


def test_select_probes_every_depth_in_topological_order(stack):
    _, _, ep = stack
    probes = per_layer.select_probes(ep)
    expected = [f"blocks.{i}.{m}" for i in range(3) for m in ("fc1", "act", "fc2", "")]
    assert [p.module for p in probes] == [e.rstrip(".") for e in expected] + ["pair", "count", "head"]
    assert [p.level for p in probes[:4]] == [2, 2, 2, 1]
    assert probes[3].type.endswith("Block") and probes[0].type.endswith("Linear")
    orders = [p.order for p in probes]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_select_probes_depth_one(stack):
    _, _, ep = stack
    assert [p.module for p in per_layer.select_probes(ep, depth=1)] == ["blocks.0", "blocks.1", "blocks.2", "pair", "count", "head"]


def test_probe_source_is_the_user_line(stack):
    _, _, ep = stack
    lines, start = inspect.getsourcelines(Block.forward)
    line = start + next(i for i, l in enumerate(lines) if "PROBE-LINE" in l)
    by_name = {p.module: p for p in per_layer.select_probes(ep)}
    # Block's output (the residual add) and fc2's (called from that line) both point at it, not at torch's Linear.
    for name in ("blocks.1", "blocks.1.fc2"):
        assert by_name[name].source == f"{__file__}:{line}", by_name[name]
        assert "self.fc2(self.act(self.fc1(x)))" in by_name[name].code


@pytest.mark.parametrize("form", ["training IR", "functionalised"])
def test_instrumented_program_returns_what_forward_hooks_see(stack, form):
    """The extra outputs are each module's output, checked against nn.Module forward hooks.

    "functionalised" (a .pt2 saved after run_decompositions) turns Counter's in-place buffer update
    into a value leaving the graph as state: it must not be taken for Counter's output.
    """
    model, x, ep = stack
    if form == "functionalised":
        ep = ep.run_decompositions({})
        assert ep.graph_signature.buffers_to_mutate  # the update is now a graph value
    seen = {}

    def hook(mod, args, out, name):
        seen[name] = (out[-1] if isinstance(out, tuple) else out).detach().clone()

    hooks = [m.register_forward_hook(lambda mod, i, o, name=name: hook(mod, i, o, name)) for name, m in model.named_modules() if name]
    try:
        with torch.no_grad():
            want_out = model(x)
    finally:
        for h in hooks:
            h.remove()
    probes = per_layer.select_probes(ep)
    assert [p.module for p in probes][-3:] == ["pair", "count", "head"]
    inst = per_layer.instrument(ep, [p.node for p in probes])
    with torch.no_grad():
        out, extras = inst.module()(x)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    assert len(extras) == len(probes)
    for p, value in zip(probes, extras):
        torch.testing.assert_close(value, seen[p.module], rtol=1e-6, atol=1e-6, msg=p.module)
    # The original program is untouched.
    assert len([s for s in ep.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]) == 1
