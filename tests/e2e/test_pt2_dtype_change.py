"""A .pt2 exported in f32 compiled with --dtype bf16: the graph has f32 casts and dtype asserts baked in
(RMSNorm's x.float() / .to(dtype)); the retarget-casts source pass removes them. Checked against eager bf16 of
the source nn.Module (which upcasts its norms): cosine >= 0.999, the bf16 profile."""

import torch

import llmc
from llmc.models import zoo


def test_bf16_from_f32_pt2_with_rmsnorm(tmp_path):
    model, args, dyn = zoo.build("tiny_llama", 0)
    path = tmp_path / "tl.pt2"
    torch.export.save(torch.export.export(model, args, dynamic_shapes=dyn), path)
    art = llmc.compile(path, dtype="bf16", output=tmp_path / "tl.vmfb")
    got = llmc.load(art)(*args)
    with torch.no_grad():
        ref = model.to(torch.bfloat16)(*args)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(got.double().flatten(), ref.double().flatten(), dim=0).item()
    assert cos >= 0.999, cos
