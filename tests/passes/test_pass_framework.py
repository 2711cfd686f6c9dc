"""The pass framework (passes/_base.py, compiler/pipeline.py): registration when llmc.passes is
imported, capability gating from the typed target table, stats (each source node counted once even
when the program is traced twice), the IR dumps, and refusals turned into llmc errors."""

import pytest
import torch

from llmc.compiler import pipeline, targets
from llmc.errors import PassError
from llmc.passes._base import REGISTRY, IRPass, PassError as Refusal, register_pass

IR = """
func.func @main(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}
"""


def _module():
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    return ir.Module.parse(IR, ctx)


def test_pass_files_register_on_import():
    import llmc.passes  # noqa: F401

    for name in [*pipeline.SOURCE_PASSES, *pipeline.GRAPH_PASSES, *pipeline.IR_PASSES]:
        assert name in REGISTRY, name


def test_gating_follows_typed_caps():
    # Every graph pass runs, in GRAPH_PASSES order, except the ones gated out (listed with their reasons).
    ungated = lambda plan: [n for n in pipeline.GRAPH_PASSES if n not in {s["name"] for s in plan.skipped}]
    from llmc.compiler import ukernels

    cpu_target = targets.resolve("cpu", None, "f32")
    cpu = pipeline.build(cpu_target)
    assert [p.name for p in cpu.graph] == ungated(cpu) and {"vecmat-as-mv", "decompose-attention", "qdq-contractions"} <= set(ungated(cpu))
    no_kernels = ukernels.unavailable(cpu_target)  # the attention kernel's gate: a C compiler, AVX2 + FMA
    assert cpu.skipped == [
        {"name": "retarget-casts", "reason": "needs dtype f16/bf16/fp8/int8, compiling f32"},
        *([{"name": "decode-attention-kernel", "reason": no_kernels},
           {"name": "chunk-attention-kernel", "reason": no_kernels}] if no_kernels else []),
        {"name": "qdq-float", "reason": "arch host lowers int8 contractions in integer arithmetic (it has int64); --int8-math float forces this form"},
        {"name": "bf16-weights", "reason": "needs dtype bf16, compiling f32"},
        {"name": "fp8-weights", "reason": "needs dtype fp8, compiling f32"},
        {"name": "int8-weights", "reason": "needs dtype int8, compiling f32"},
        {"name": "f32-gemm-weights", "reason": "no entry point with a fixed number of rows (prefill chunk or bucket)"},
        {"name": "bf16-outputs", "reason": "needs dtype bf16, compiling f32"},
    ]
    vk = pipeline.build(targets.resolve("vulkan", None, "bf16"))
    assert [p.name for p in vk.graph] == ungated(vk) and "bf16-weights" in ungated(vk)
    assert [s["name"] for s in vk.skipped] == ["vecmat-as-mv", "decode-attention-kernel", "chunk-attention-kernel", "qdq-float", "fp8-weights", "int8-weights", "f32-gemm-weights", "bf16-outputs",
                                               "log10-to-log", "f64-math"]
    # the int8 fallback follows the arch's int64 capability, or the int8_math option
    mali = pipeline.build(targets.resolve("vulkan", "valhall4", "f32"))
    assert "qdq-float" in [p.name for p in mali.graph]
    forced = pipeline.build(targets.resolve("cpu", None, "f32"), options={"int8_math": "float"})
    assert "qdq-float" in [p.name for p in forced.graph]
    hip = pipeline.build(targets.resolve("hip", "gfx942", "bf16"))
    names = {s["name"]: s["reason"] for s in hip.skipped}
    assert "decompose-attention" in names and "'decompose'" in names["decompose-attention"] and "'fused'" in names["decompose-attention"]
    assert "log10-to-log" in names and "llvm-cpu" in names["log10-to-log"]
    assert [p.name for p in hip.source] == ["retarget-casts"]


def test_ir_pass_stats_and_dumps(tmp_path):
    plan = pipeline.build(targets.resolve("cpu", None, "f32"), only=["log10-to-log"])
    module = _module()
    pipeline.run_ir(plan, module, pipeline.Dumper(tmp_path))
    assert plan.stats()[0] | {} == {**plan.stats()[0], "name": "log10-to-log", "kind": "ir", "matched": 1, "rewrote": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00-import.mlir", "01-log10-to-log.mlir"]
    assert "torch.aten.log10" in (tmp_path / "00-import.mlir").read_text()
    assert "torch.aten.log10" not in (tmp_path / "01-log10-to-log.mlir").read_text()


def test_decomposition_counts_each_node_once():
    class M(torch.nn.Module):
        def forward(self, q):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q) * 2

    ep = torch.export.export(M(), (torch.randn(1, 2, 3, 4),))
    plan = pipeline.build(targets.resolve("cpu", None, "f32"))
    for entry in ("prefill", "decode"):  # the same node name in two entry points counts twice
        out = pipeline.run_graph(plan, ep, entry)
    stats = {s["name"]: s for s in plan.stats()}
    assert stats["decompose-attention"]["rewrote"] == 2 and stats["decompose-attention"]["forms"] == {"general": 2}
    assert not any("scaled_dot_product" in str(n.target) for n in out.graph.nodes)


def test_refusal_becomes_llmc_error():
    @register_pass("test-refuses")
    class Refuses(IRPass):
        def run(self, module):
            raise Refusal("no correct rewrite for this op")

    try:
        plan = pipeline.build(targets.resolve("cpu", None, "f32"), only=["test-refuses"])
        with pytest.raises(PassError, match="pass test-refuses: no correct rewrite") as info:
            pipeline.run_ir(plan, _module())
        assert info.value.exit_code == 3
    finally:
        del REGISTRY["test-refuses"]


def test_duplicate_name_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register_pass("log10-to-log")(type("Other", (IRPass,), {}))


def test_unknown_pass_name():
    with pytest.raises(PassError, match="unknown pass 'nope'"):
        pipeline.build(targets.resolve("cpu", None, "f32"), only=["nope"])


def test_last_mlir_is_the_highest_numbered_not_the_last_name(tmp_path):
    """Dumper.last_mlir (the IR iree-compile was given, read by tools/bench_tp.py and tests): past 99
    steps a name sort would pick 99-… over 100-…; .txt (FX) dumps are not IR."""
    for name in ("00-import.mlir", "10-a.mlir", "99-b.mlir", "100-c.mlir", "101-prefill-export.txt"):
        (tmp_path / name).write_text("")
    assert pipeline.Dumper.last_mlir(tmp_path).name == "100-c.mlir"
