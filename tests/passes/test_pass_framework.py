"""The pass framework (passes/_base.py, compiler/pipeline.py): registration, capability gating, stats,
and the IR dumps. No rewrite pass exists yet; these pin the contract the first one will use. A toy
pass registered here (and removed after) rewrites real torch-dialect IR from the importer."""

import pytest

from llmc.compiler import pipeline
from llmc.passes._base import REGISTRY, Pass, Requires, register_pass

IR = """
func.func @main(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.neg %0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}
"""


@pytest.fixture
def toy_pass(monkeypatch):
    @register_pass("test-count-neg", Requires(backends=("llvm-cpu",), dtypes=("f32", "bf16")))
    class CountNeg(Pass):
        def run(self, module):
            for op in module.body.operations[0].regions[0].blocks[0].operations:
                if op.operation.name == "torch.aten.neg":
                    self.stats.rewrite()
            return self.stats

    monkeypatch.setattr(pipeline, "PIPELINE", ["test-count-neg"])
    yield CountNeg
    del REGISTRY["test-count-neg"]


def _module():
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    return ir.Module.parse(IR, ctx)


def test_gating_skips_with_reason(toy_pass):
    run, skipped = pipeline.build("vulkan-spirv", "f32")
    assert run == [] and skipped == [{"name": "test-count-neg", "reason": "needs backend llvm-cpu, target uses vulkan-spirv"}]
    run, skipped = pipeline.build("llvm-cpu", "f16")
    assert run == [] and "needs dtype f32/bf16" in skipped[0]["reason"]
    run, skipped = pipeline.build("llvm-cpu", "bf16")
    assert [type(p) for p in run] == [toy_pass] and skipped == []


def test_stats_and_dumps(toy_pass, tmp_path):
    run, _ = pipeline.build("llvm-cpu", "f32")
    stats = pipeline.run_passes(_module(), run, tmp_path)
    assert [s.as_dict() for s in stats] == [{"name": "test-count-neg", "matched": 2, "rewrote": 2, "declined": 0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00-import.mlir", "01-test-count-neg.mlir"]
    assert "torch.aten.neg" in (tmp_path / "00-import.mlir").read_text()


def test_duplicate_name_is_refused(toy_pass):
    with pytest.raises(ValueError, match="registered twice"):
        register_pass("test-count-neg")(type("Other", (Pass,), {}))
