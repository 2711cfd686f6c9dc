"""Every zoo model, f32 and bf16, compiled for cpu and compared with eager PyTorch.

Tolerances come from the one table in llmc.compiler.diff_metrics (f32: max relative error <= 1e-5; bf16:
cosine >= 0.999 against eager bf16); they are not picked per test.

Each (model, dtype) is compiled once per module (the `compiled` fixture): the dynamic-sequence test
and the wrong-model test read the f32 modules test_zoo_matches_eager built.
"""

import functools

import pytest
import torch

import llmc
from llmc import dtypes
from llmc.compiler import diff_metrics, export
from llmc.models import zoo


def eager(model, args, dtype):
    if dtype == "f32":
        ref_model = model
    else:
        tdt = dtypes.compute_torch_dtype(dtype)
        ref_model = export.CastInputs(export.convert_module(model, tdt), tdt)
    with torch.no_grad():
        return ref_model(*args)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(name, dtype) -> (model, args, artifact): zoo.build(name) (seed 0) compiled once per module."""
    root = tmp_path_factory.mktemp("zoo")

    @functools.cache
    def get(name, dtype):
        model, args, dynamic = zoo.build(name)
        return model, args, llmc.compile(model, args, dtype=dtype, dynamic_shapes=dynamic, output=root / f"{name}_{dtype}.vmfb")

    return get


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", zoo.ZOO)
def test_zoo_matches_eager(compiled, name, dtype):
    model, args, art = compiled(name, dtype)
    got = llmc.load(art)(*args)
    ref = eager(model, args, dtype)
    assert got.dtype == ref.dtype, "outputs come back in the dtype eager returns for the converted model"
    r = diff_metrics.compare("out", got, ref, diff_metrics.TOLERANCES[dtype])
    assert r.passed, r
    if dtype == "f32":
        assert r.max_rel <= 1e-5
    else:
        assert r.cosine >= 0.999
    # The user's module is never modified by compiling it in another dtype.
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_dynamic_sequence_one_artifact_many_lengths(compiled):
    model, _, art = compiled("tiny_llama", "f32")  # compiled with zoo's dynamic sequence dim
    mod = llmc.load(art)
    g = torch.Generator().manual_seed(5)
    for seq in (3, 17, 64):
        ids = torch.randint(0, 256, (1, seq), generator=g)
        got = mod(ids)
        with torch.no_grad():
            ref = model(ids)
        assert got.shape == (1, seq, 256)
        r = diff_metrics.compare(f"seq{seq}", got, ref, diff_metrics.TOLERANCES["f32"])
        assert r.max_rel <= 1e-5, r


def test_a_wrong_model_is_caught(compiled):
    """The comparison itself can fail: an artifact from other weights is far off (mlp_silu's seed-0
    module against eager on the seed-1 weights)."""
    _, args, art = compiled("mlp_silu", "f32")
    other, _, _ = zoo.build("mlp_silu", seed=1)
    got = llmc.load(art)(*args)
    r = diff_metrics.compare("out", got, eager(other, args, "f32"), diff_metrics.TOLERANCES["f32"])
    assert not r.passed and r.max_rel > 0.1
