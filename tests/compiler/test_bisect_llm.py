"""`llmc bisect CHECKPOINT`: each entry point of the Llama module (prefill, decode) is bisected on its
own, through the same export and lowering as `llmc compile CHECKPOINT`."""

from __future__ import annotations

import json

import pytest
import torch

from llmc.compiler import bisect, cli, iree
from llmc.errors import CompileError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from llmc.tools.make_checkpoint import write_checkpoint

    return write_checkpoint("tiny", "hf", tmp_path_factory.mktemp("bisect-llm") / "tiny")


def test_clean_checkpoint_is_ok_for_both_entry_points(checkpoint, tmp_path, capsys):
    code = cli.main(["bisect", str(checkpoint), "-o", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"), "--max-seq-len", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["format"] == "llmc-bisect-llm/1"
    assert [r["model"] for r in rep["entry_points"]] == ["tiny:prefill", "tiny:decode"]
    for r in rep["entry_points"]:
        assert r["status"] == "ok" and r["compared_with_eager"] and r["ops_total"] > 20 and r["compile_attempts"] == 1
    assert out.count("ok: tiny:") == 2


def test_bf16_bisects_the_program_compile_builds(checkpoint, tmp_path, capsys, monkeypatch):
    """--dtype bf16 on cpu: the entry points as `llmc compile` makes them, with their bf16 KV cache
    (--kv-dtype auto): the programs take bf16 caches, compile, and match eager on those inputs."""
    seen = []
    real = bisect._bisect_program

    def spy(exported, name, probe, plan, given_inputs, *a, **kw):
        seen.append((name, given_inputs[0][-1].dtype,
                     [n.meta["val"].dtype for n in exported.program.graph.find_nodes(op="placeholder") if n.name.startswith("cache")][-1:]))
        return real(exported, name, probe, plan, given_inputs, *a, **kw)

    monkeypatch.setattr(bisect, "_bisect_program", spy)
    code = cli.main(["bisect", str(checkpoint), "--dtype", "bf16", "-o", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"),
                     "--max-seq-len", "16"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    for r in json.loads((tmp_path / "r.json").read_text())["entry_points"]:
        assert r["status"] == "ok" and r["compared_with_eager"], r
    assert [(n.split(":")[1], dt) for n, dt, _ in seen] == [("prefill", torch.bfloat16), ("decode", torch.bfloat16)]
    assert all(program == [torch.bfloat16] for *_, program in seen), seen


def test_a_failing_op_in_decode_is_localised(checkpoint, tmp_path, monkeypatch):
    # Stand-in for an IREE crash: iree-compile "fails" on any module holding an rsqrt (RMSNorm), but
    # only for the decode function (its first argument, the token, is [1,1]; prefill's is [1,?]).
    # The search must find the first rsqrt, in layer 0's input norm; prefill compiles once and is ok.
    real = iree.compile_mlir

    def flaky(mlir, output, flags, **kw):
        if "torch.aten.rsqrt" in mlir and "(%arg0: !torch.vtensor<[1,1],si64>" in mlir:
            raise CompileError("iree-compile exited with code 1", diagnostics="input.mlir:3:5: error: simulated crash in rsqrt\n")
        return real(mlir, output, flags, **kw)

    monkeypatch.setattr(iree, "compile_mlir", flaky)
    reports = bisect.bisect_llm(checkpoint, output_dir=tmp_path / "out", max_seq_len=16, quiet=True)
    prefill, decode = reports
    assert prefill.status == "ok" and prefill.compile_attempts == 1
    assert decode.status == "compile-error" and decode.culprit is not None
    assert decode.culprit.op == "aten.rsqrt.default"
    assert decode.culprit.module_path == "model.layers.0.input_layernorm"
    assert (tmp_path / "out" / "decode" / "repro.mlir").exists()
    assert decode.exit_code == 1
