"""compiler/lower.py, the one lowering path: the manifest's pass records and --dump-ir after every step.
(Reproducible artifacts, the same input compiled twice giving identical bytes, are checked on the
fixture build of tests/compiler/test_artifacts.py::test_recompile_is_identical_and_replaces_artifacts_atomically.)"""

import json

import torch

import llmc


class _Log10Attn(torch.nn.Module):
    def forward(self, q, x):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q), torch.log10(x)


def test_manifest_records_passes_and_dump_has_every_step(tmp_path):
    args = (torch.randn(1, 2, 4, 8), torch.rand(5) + 0.5)
    art = llmc.compile(_Log10Attn(), args, output=tmp_path / "m.vmfb", dump_ir=tmp_path / "dump")
    m = json.loads(art.manifest.read_text())
    ran = {p["name"]: p for p in m["passes"]}
    assert ran["decompose-attention"]["rewrote"] == 1 and ran["decompose-attention"]["forms"] == {"general": 1}
    assert ran["log10-to-log"]["rewrote"] == 1
    assert {"name": "retarget-casts", "reason": "needs dtype f16/bf16/fp8/int8, compiling f32"} in m["passes_skipped"]
    steps = sorted(p.name for p in (tmp_path / "dump").iterdir())
    # One step for every decomposition pass of the plan (in GRAPH_PASSES order), then one per other graph pass.
    from llmc.compiler.pipeline import GRAPH_PASSES
    from llmc.passes._base import REGISTRY, DecompositionPass

    decomposing = [n for n in GRAPH_PASSES if issubclass(REGISTRY[n], DecompositionPass) and n in ran]
    assert {"prims-as-aten", "slice-copy", "decompose-attention"} <= set(decomposing)
    assert steps == [
        "00-main-export.txt", "01-main-decompose.txt", "02-main-zero-k-products.txt",
        "03-main-vecmat-as-mv.txt", "04-main-dtype-harmony.txt", "05-import.mlir", "06-log10-to-log.mlir", "07-f64-math.mlir", "08-bitcast-elementwise.mlir",
    ]
    assert (tmp_path / "dump" / "01-main-decompose.txt").read_text().splitlines()[0] == f"# decomposition passes: {', '.join(decomposing)}"
    assert "log10" in (tmp_path / "dump" / "05-import.mlir").read_text()
    assert "torch.aten.log10" not in (tmp_path / "dump" / "06-log10-to-log.mlir").read_text()
    # and the module computes what eager does (log10 through log / ln 10 within f32 rounding)
    got = llmc.load(art)(*args)
    ref = _Log10Attn()(*args)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-6, atol=1e-6)
