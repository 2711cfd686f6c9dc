"""passes/_scratch.py: weights a pass makes from a memory-mapped checkpoint live in scratch files.

Checked: an in-memory source keeps its tensor in memory; a memory-mapped source's made tensor comes
back equal, file-backed and read-only; a view of the source is not copied; close() removes the files
while the tensors stay readable; and a whole compile from a memory-mapped checkpoint routes the
packed bf16 and fp8 weights through the scratch store and still matches eager.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from llmc.dtypes import by_name
from llmc.passes._scratch import Scratch, is_file_backed


@pytest.fixture
def mapped(tmp_path):
    torch.save({"w": torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)}, tmp_path / "w.pt")
    return torch.load(tmp_path / "w.pt", weights_only=True, mmap=True)["w"]


def test_in_memory_source_keeps_the_made_tensor_in_memory():
    source = torch.randn(16, 16)
    made = source * 2
    s = Scratch()
    assert s.keep(source, made) is made and s.nbytes == 0
    assert not is_file_backed(made)


def test_mapped_source_moves_the_made_tensor_to_a_read_only_file(mapped, tmp_path):
    assert is_file_backed(mapped)
    made = mapped.to(torch.bfloat16).view(torch.int16)
    s = Scratch(root=str(tmp_path))
    kept = s.keep(mapped, made)
    assert kept is not made and torch.equal(kept, made) and kept.dtype == torch.int16 and kept.shape == made.shape
    assert is_file_backed(kept) and s.nbytes == made.numel() * 2
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("llmc-scratch-")]
    assert len(list(folder.iterdir())) == 1
    view = mapped.view(torch.int32)  # the source's own storage: nothing to hold
    assert s.keep(mapped, view) is view
    s.close()
    assert not folder.exists()
    assert torch.equal(kept, made)  # the mapping outlives the file


def test_source_pages_are_dropped_but_its_values_stay(mapped, tmp_path):
    from llmc.passes._scratch import _drop_pages

    want = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)
    s = Scratch(root=str(tmp_path))
    s.keep(mapped, mapped * 2)  # reads the source, then drops its pages
    assert torch.equal(mapped, want)  # faulted back in from the file
    # A page written in place is the only copy of its data: it is never dropped. (Row 30 lies on a
    # page wholly inside the tensor: a partial page at either end is never dropped anyway.)
    mapped[30, 0] = -1.0
    _drop_pages(mapped)
    assert float(mapped[30, 0]) == -1.0


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_compile_from_a_mapped_checkpoint_uses_scratch_and_matches_eager(tmp_path, monkeypatch, dtype):
    import llmc
    from llmc.compiler import pipeline
    from llmc.models.llama.model import LlamaPrefill, new_cache

    from llmc.compiler.llm import load_llama
    from llmc.models.llama.config import get_config
    from llmc.tools.make_checkpoint import write_checkpoint

    # One layer of the tiny Llama: each packed linear takes the same path, and one layer compiles faster.
    config = dataclasses.replace(get_config("tiny"), n_layers=1, name="tiny-1-layer")
    ckpt = write_checkpoint(config, "hf", tmp_path / "ckpt", "bf16", 3)  # safetensors: memory-mapped when loaded
    model = load_llama(ckpt)
    cfg = model.config
    made = []
    real_build = pipeline.build

    def build(*a, **k):
        plan = real_build(*a, **k)
        made.append(plan.ctx.scratch)
        return plan

    monkeypatch.setattr(pipeline, "build", build)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    art = llmc.compile(ckpt, output=tmp_path / "m.vmfb", dtype=dtype, max_seq_len=16, quiet=True)
    linears = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    assert made and made[0].nbytes >= linears * (2 if dtype == "bf16" else 1)  # every packed linear went to a file
    assert not [p for p in os.listdir(tmp_path) if p.startswith("llmc-scratch-")]  # removed after the .irpa was written
    prompt = torch.tensor([[1, 7, 3, 9]])
    with torch.no_grad():
        ref = LlamaPrefill(model.float())(prompt, *new_cache(cfg, 16, torch.float32))[0]
    mod = llmc.load(art)  # its cache in the manifest's dtype (bf16: --kv-dtype auto gives a bf16 cache)
    got = mod.prefill(prompt, *new_cache(cfg, 16, by_name(mod.manifest["llm"]["cache"]["dtype"]).torch))[0]
    # bf16: the same bf16 weights in f32 math, the rope tables rounded to bf16 as eager bf16 rounds
    # them (measured 0.26% of the largest logit); fp8: the quantization error of E4M3 on top. A wrong
    # packed layout is off by the size of the logits.
    tol = 0.01 if dtype == "bf16" else 0.1
    assert float((got.float() - ref).abs().max()) <= tol * float(ref.abs().max())
