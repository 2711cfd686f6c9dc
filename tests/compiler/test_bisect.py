"""llmc bisect: from a failing model to a one-op reproducer, with real iree-compile runs.

The compile-failure case is real: IREE 3.13's torch input conversion has no lowering for
`aten.erfinv` ("failed to legalize operation 'torch.aten.erfinv'"), so a ~50-op model holding one
erfinv fails to compile for llvm-cpu. The drift case is real too: in f16, IREE accumulates a long
`sum` in f16 where eager PyTorch accumulates in f32.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from llmc.compiler import bisect, bisect_graph, bisect_session, export, pipeline, targets

CLI = [sys.executable, "-m", "llmc.compiler.cli"]
TOOLS_PATH = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


class Probit(nn.Module):
    """The one op IREE 3.13 can't compile (aten.erfinv), between ops it can."""

    def forward(self, x):
        return torch.erfinv(torch.tanh(x) * 0.99) * math.sqrt(2)


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class FiftyOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = Block()
        self.probit = Probit()
        self.post = Block()

    def forward(self, x):
        return self.post(self.probit(self.pre(x))).softmax(-1)


ERFINV_LINE = inspect.getsourcelines(Probit.forward)[1] + 1


class Energy(nn.Module):
    """A sum over 8192 positive values: f16 accumulation drifts by several percent."""

    def forward(self, x):
        return (x * x).sum(-1, keepdim=True)


class DriftModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.energy = Energy()

    def forward(self, x):
        e = self.energy(torch.tanh(x) * 2)
        return self.proj(x[:, :16]) * e / 1000


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=900, env=TOOLS_PATH)


# ---------------------------------------------------------------------------------------------
# The search itself, on an injected failure predicate (no compiles)


def test_search_prefix_finds_every_position_in_log2_calls():
    for n in range(1, 70):
        for culprit in range(1, n + 1):
            calls = []

            def fails(k):
                calls.append(k)
                return k >= culprit

            assert bisect_graph.search_prefix(n, fails) == culprit
            assert len(calls) <= math.ceil(math.log2(n)), (n, culprit, calls)
            assert n not in calls  # the whole model's failure is known: never recompiled


def test_search_prefix_when_no_prefix_fails():
    calls = []
    assert bisect_graph.search_prefix(8, lambda k: calls.append(k) or False, known_fail_at_n=False) is None
    assert calls == [8]


def test_error_signature_ignores_ssa_names_and_locations():
    a = "/tmp/llmc-compile-1/input.mlir:6:10: error: failed to legalize operation 'torch.aten.erfinv': %77 = \"torch.aten.erfinv\"(%76)"
    b = "/tmp/x/repro.mlir:3:8: error: failed to legalize operation 'torch.aten.erfinv': %2 = \"torch.aten.erfinv\"(%1)"
    c = "in.mlir:1:1: error: failed to legalize operation 'torch.aten.erf': %2 = \"torch.aten.erf\"(%1)"
    sig_a, first_a = bisect_session.error_signature("note: something\n" + a)
    assert sig_a == "failed to legalize operation 'torch.aten.erfinv'"
    assert first_a.startswith("failed to legalize operation 'torch.aten.erfinv': %77")
    assert bisect_session.error_signature(b)[0] == sig_a
    assert bisect_session.error_signature(c)[0] != sig_a
    op = 'loc("m.py":5:0): error: failed to legalize operation \'torch.operator\' that was explicitly marked illegal: %3 = "torch.operator"(%2) <{name = "torch.aten.lgamma"}>'
    assert bisect_session.error_signature(op)[0].endswith("(torch.aten.lgamma)")


def test_prefix_returns_the_frontier_and_runs_like_the_model():
    class M(nn.Module):
        def forward(self, x):
            a = x + 1
            b = a * 2
            return a - b, b.relu()

    x = torch.randn(3, 4)
    ep = export.export_model(M(), (x,)).program
    ops = bisect_graph.graph_ops(ep)
    assert [str(n.target) for n in ops] == ["aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.relu.default"]
    outs = bisect_graph.prefix_outputs(ep, ops, 2)
    assert [n.name for n in outs] == [ops[0].name, ops[1].name]  # a and b are both used later
    got = bisect_graph.subprogram(ep, outs).module()(x)
    torch.testing.assert_close(got[0], x + 1)
    torch.testing.assert_close(got[1], (x + 1) * 2)
    values = bisect_session.eager_values(ep, (x,), {})
    torch.testing.assert_close(values[ops[3].name], ((x + 1) * 2).relu())


# ---------------------------------------------------------------------------------------------
# Acceptance: a real iree-compile failure, through the CLI


def test_cli_bisects_a_real_compile_failure_to_one_op(tmp_path, monkeypatch):
    """`llmc bisect` in this process (conftest.llmc_in_process: exit code, stdout and stderr as the CLI
    gives them); the reproducer it writes is then run as a user would, in fresh processes."""
    from conftest import llmc_in_process

    torch.manual_seed(0)
    model, x = FiftyOps(), torch.randn(2, 4, 16)
    ep = torch.export.export(model, (x,))
    # bisect searches the program after the graph passes (what iree-compile sees)
    plan = pipeline.build(targets.resolve("cpu", None, "f32"))
    n_ops = len(bisect_graph.graph_ops(pipeline.run_graph(plan, export.export_model(ep).program)))
    assert 40 <= n_ops <= 60, n_ops
    torch.export.save(ep, str(tmp_path / "fifty.pt2"))

    monkeypatch.chdir(tmp_path)
    proc = llmc_in_process("bisect", "fifty.pt2", "-o", "repro", "--json", "report.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rep = json.loads((tmp_path / "report.json").read_text())

    assert rep["status"] == "compile-error" and rep["ops_total"] == n_ops
    assert rep["error"]["first_line"].startswith("failed to legalize operation 'torch.aten.erfinv'")
    c = rep["culprit"]
    assert c["op"] == "aten.erfinv.default"
    assert (c["module_path"], c["module_type"]) == ("probit", "Probit")
    assert c["source"].startswith(f"{__file__}:{ERFINV_LINE}: return torch.erfinv("), c["source"]
    assert c["inputs"] == [{"shape": [2, 4, 16], "dtype": "float32"}]
    assert rep["compile_attempts"] <= 12, rep["attempts"]
    assert rep["reproducer"]["kind"] == "one op" and rep["reproducer"]["reproduced"] is True

    # One progress line per compile attempt on stderr; the report on stdout.
    progress = [l for l in proc.stderr.splitlines() if re.match(r"llmc bisect: attempt \d+: ", l)]
    assert len(progress) == rep["compile_attempts"]
    assert "culprit:    aten.erfinv.default (node erfinv" in proc.stdout
    assert "module:     probit (Probit)" in proc.stdout

    # The reproducer IR holds the one op and nothing else: no other aten op, no parameters.
    out = tmp_path / "repro"
    mlir = (out / "repro.mlir").read_text()
    assert re.findall(r"torch\.aten\.[\w.]+", mlir) == ["torch.aten.erfinv"], mlir
    assert "util.global" not in mlir

    # The saved command reproduces the failure with IREE's own binary.
    command = (out / "command.sh").read_text()
    assert "iree-compile repro.mlir --iree-input-type=torch" in command and "--iree-llvmcpu-target-cpu=host" in command
    rerun = subprocess.run(["sh", str(out / "command.sh")], capture_output=True, text=True, env=TOOLS_PATH)
    assert rerun.returncode != 0
    assert "error: failed to legalize operation 'torch.aten.erfinv'" in rerun.stderr

    # repro.py rebuilds the one-op module with torch alone and exports it.
    built = subprocess.run([sys.executable, "repro.py"], cwd=out, capture_output=True, text=True, env=TOOLS_PATH)
    assert built.returncode == 0, built.stderr
    calls = [n for n in torch.export.load(str(out / "repro.pt2")).graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in calls] == ["aten.erfinv.default"]
    assert list(calls[0].args[0].meta["val"].shape) == [2, 4, 16]


def test_cli_model_that_compiles_and_matches_exits_0(tmp_path, monkeypatch, capsys):
    from llmc.compiler import cli

    torch.manual_seed(0)
    ep = torch.export.export(Block(), (torch.randn(2, 16),))
    torch.export.save(ep, str(tmp_path / "ok.pt2"))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["bisect", "ok.pt2", "-o", "never", "--json", "ok.json"])  # in-process: torch is loaded
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.startswith("ok: ok.pt2 compiles for cpu/f32 and matches eager PyTorch"), out
    assert "attempt 1: whole model: ok" in err
    rep = json.loads((tmp_path / "ok.json").read_text())
    assert rep["status"] == "ok" and rep["compile_attempts"] == 1 and rep["culprit"] is None
    assert rep["attempts"][0]["outcome"] == "ok"
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (["missing.pt2"], "missing.pt2"),
        (["model.pt2", "--target", "tpu"], "--target='tpu'"),
        (["model.pt2", "--json", "nodir/r.json"], "nodir"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, named):
    (tmp_path / "model.pt2").write_bytes(b"not a zip")
    proc = run_cli("bisect", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmc: error: ") and named in lines[0], proc.stderr


# ---------------------------------------------------------------------------------------------
# Drift: compiles, but the output differs from eager PyTorch (real IREE numerics)


def test_api_bisects_a_real_f16_drift_to_one_op(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 8192)
    rep = bisect.bisect(DriftModel(), (x,), dtype="f16", output_dir=tmp_path / "drift", quiet=True)
    assert rep.status == "drift" and rep.exit_code == 1
    assert rep.failure.kind == "drift" and any(o.max_rel > 0.02 for o in rep.failure.outputs)
    c = rep.culprit
    assert c.op == "aten.sum.dim_IntList" and c.module_path == "energy", c
    assert c.inputs == [{"shape": [4, 8192], "dtype": "float16"}]
    # Prefixes without the sum compiled, ran and matched: the comparison itself is not what fails.
    assert any(a.outcome == "ok" and a.what.startswith("prefix") for a in rep.attempts)
    assert rep.compile_attempts <= 12
    assert rep.reproducer_kind == "one op" and rep.reproduced is True

    out = tmp_path / "drift"
    assert re.findall(r"torch\.aten\.[\w.]+", (out / "repro.mlir").read_text()) == ["torch.aten.sum.dim_IntList"]
    rerun = subprocess.run(["sh", str(out / "command.sh")], capture_output=True, text=True, env=TOOLS_PATH)
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    line = next(l for l in rerun.stdout.splitlines() if l.startswith("DRIFT output 0"))
    assert float(re.search(r"max_rel ([\d.e+-]+)", line).group(1)) > 0.02
    assert json.loads(json.dumps(rep.as_dict()))["culprit"]["op"] == "aten.sum.dim_IntList"


def test_bad_paths_are_one_line_errors(tmp_path, monkeypatch):
    """Bad MODEL and -o paths: exit 2, one `llmc: error:` line naming the path, nothing created.
    In-process (conftest.llmc_in_process): a list of error cases, each a Python with torch otherwise."""
    from conftest import llmc_in_process

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.pth").write_bytes(b"x")
    (tmp_path / "file").write_text("x")
    pt2 = tmp_path / "lin.pt2"
    torch.export.save(torch.export.export(nn.Linear(4, 2), (torch.randn(1, 4),)), pt2)
    cases = [
        (("m.pth",), "llmc bisect takes a torch.export archive (.pt2)"),
        (("lin.pt2", "-o", "file"), "exists and is not a directory"),
        (("lin.pt2", "-o", "no/such/dir"), "does not exist"),
    ]
    for args, needle in cases:
        before = set(tmp_path.rglob("*"))
        r = llmc_in_process("bisect", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("llmc: error:") and needle in lines[0], (args, r.stderr)
        assert set(tmp_path.rglob("*")) == before
