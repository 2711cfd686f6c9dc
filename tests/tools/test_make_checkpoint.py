"""tools/make_checkpoint.py: the files it writes (layout, index, config), its init, determinism,
and that an error or interrupt leaves nothing behind. Loading equivalence between the formats is
tested in tests/models/test_llama_loaders.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from llmc.errors import UsageError
from llmc.models.llama.config import LlamaConfig, get_config
from llmc.models.llama.loaders import llama_param_shapes, load_checkpoint
from llmc.tools import make_checkpoint as mc

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "make_checkpoint.py"


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_cli_writes_sharded_hf_checkpoint(tmp_path):
    out = tmp_path / "ck"
    r = subprocess.run([sys.executable, str(SCRIPT), "--config", "tiny", "--format", "hf", "--out", str(out),
                        "--dtype", "f16", "--seed", "3", "--shard-size-gb", "0.0001"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "make_checkpoint: tiny (21 tensors" in r.stderr and f"wrote {out}" in r.stderr
    cfg = get_config("tiny")
    shapes = llama_param_shapes(cfg)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard_names = sorted(set(index["weight_map"].values()))
    n = len(shard_names)
    assert n > 1 and shard_names == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted([*shard_names, "config.json", "model.safetensors.index.json"])
    assert list(index["weight_map"]) == list(shapes)
    assert index["metadata"]["total_size"] == sum(math.prod(s) * 2 for s in shapes.values())
    for name in shard_names:
        members = [k for k, v in index["weight_map"].items() if v == name]
        assert sum(math.prod(shapes[k]) * 2 for k in members) <= 1e5 or len(members) == 1  # a lone big tensor may exceed
        with safe_open(str(out / name), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(k for k, v in index["weight_map"].items() if v == name)
            for k in f.keys():
                t = f.get_tensor(k)
                assert t.dtype == torch.float16 and tuple(t.shape) == shapes[k]
                assert torch.equal(t, mc.random_tensor(k, shapes[k], torch.float16, 3))
    c = json.loads((out / "config.json").read_text())
    assert c["torch_dtype"] == "float16" and c["num_key_value_heads"] == 2
    assert LlamaConfig.from_hf_config(c) == cfg
    assert leftovers(tmp_path) == []


def test_meta_files(tmp_path):
    cfg = get_config("tiny-llama3")
    out = mc.write_checkpoint(cfg, "meta", tmp_path / "m", "bf16", 0)
    assert sorted(p.name for p in out.iterdir()) == ["consolidated.00.pth", "params.json"]
    assert LlamaConfig.from_meta_params(json.loads((out / "params.json").read_text())) == cfg
    sd = torch.load(out / "consolidated.00.pth", weights_only=True)  # a plain torch.load reads it
    assert "output.weight" not in sd  # tied
    assert len(sd) == len(llama_param_shapes(cfg))
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    assert torch.equal(sd["layers.1.feed_forward.w1.weight"], mc.random_tensor("model.layers.1.mlp.gate_proj.weight", (192, 64), torch.bfloat16, 0))


def test_init_statistics(tmp_path):
    _, s = load_checkpoint(mc.write_checkpoint("tiny", "hf", tmp_path / "c", "f32", 0))
    for name, t in s.items():
        if t.dim() == 1:
            assert abs(t.mean().item() - 1.0) < 0.05 and 0.07 < t.std().item() < 0.13, name
        else:
            want = 1 / math.sqrt(t.shape[1])
            assert abs(t.mean().item()) < 0.2 * want and abs(t.std().item() / want - 1) < 0.1, (name, t.std().item(), want)


def test_same_seed_same_bytes_and_per_tensor_seeding(tmp_path):
    a = mc.write_checkpoint("tiny", "hf", tmp_path / "a", "bf16", 7)
    b = mc.write_checkpoint("tiny", "hf", tmp_path / "b", "bf16", 7)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    # Each tensor depends only on (seed, name, shape): a deeper model shares the first layers' weights.
    deeper = get_config("tiny").replace(n_layers=3, name="tiny3")
    _, s2 = load_checkpoint(a)
    _, s3 = load_checkpoint(mc.write_checkpoint(deeper, "hf", tmp_path / "c", "bf16", 7))
    assert all(torch.equal(s2[k], s3[k]) for k in s2)
    assert "model.layers.2.mlp.up_proj.weight" in s3
    assert mc.tensor_seed(0, "x") != mc.tensor_seed(1, "x") != mc.tensor_seed(0, "y")


@pytest.mark.parametrize("fmt", ["meta", "hf"])
def test_interrupt_leaves_nothing(tmp_path, monkeypatch, fmt):
    real = mc.random_tensor
    calls = []

    def flaky(*a, **k):
        calls.append(a[0])
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(mc, "random_tensor", flaky)
    with pytest.raises(KeyboardInterrupt):
        mc.write_checkpoint("tiny", fmt, tmp_path / "out", "f32", 0)
    assert len(calls) == 5
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_existing_output_refused_then_replaced_with_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = subprocess.run([sys.executable, str(SCRIPT), "--config", "tiny", "--format", "meta", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"make_checkpoint: error: {out} already exists" in r.stderr and "--force" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(UsageError, match="already exists"):
        mc.write_checkpoint("tiny", "hf", out, "f32", 0)
    mc.write_checkpoint("tiny", "hf", out, "f32", 0, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert leftovers(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private 0o700


@pytest.mark.parametrize("kwargs, message", [
    ({"fmt": "gguf"}, "format 'gguf' is not one of meta, hf"),
    ({"dtype": "int8"}, "dtype 'int8' is not one of f32, f16, bf16"),
    ({"shard_size_gb": 0}, "shard size 0 GB must be positive"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    args = {"config": "tiny", "fmt": "hf", "out_dir": tmp_path / "o", "dtype": "f32", "seed": 0, **kwargs}
    with pytest.raises(UsageError, match=message):
        mc.write_checkpoint(**args)
    assert not (tmp_path / "o").exists()


# ---- --tokenizer -----------------------------------------------------------------------------------

def test_cli_tokenizer_files_and_config_ids(tmp_path):
    """--tokenizer writes the tokenizer beside the weights and puts its BOS/EOS ids in the config."""
    out = tmp_path / "ck"
    r = subprocess.run([sys.executable, str(SCRIPT), "--config", "tiny-llama3", "--format", "hf", "--out", str(out),
                        "--dtype", "f32", "--tokenizer", "hf"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() <= 512
    c = json.loads((out / "config.json").read_text())
    assert c["bos_token_id"] == tok.token_to_id("<|begin_of_text|>")
    assert c["eos_token_id"] == [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["bos_token"] == "<|begin_of_text|>" and "<|start_header_id|>" in tc["chat_template"]

    meta = mc.write_checkpoint("tiny-llama3", "meta", tmp_path / "m", "f32", 0, tokenizer="sentencepiece")
    assert sorted(p.name for p in meta.iterdir()) == ["consolidated.00.pth", "params.json", "tokenizer.model"]  # Meta ships no tokenizer_config.json
    p = json.loads((meta / "params.json").read_text())
    assert (p["bos_id"], p["eos_ids"]) == (1, [2])


@pytest.mark.parametrize("kind", mc.TOKENIZERS)
def test_tokenizer_training_is_deterministic_and_fits(tmp_path, kind):
    import time

    cfg = get_config("tiny-llama3")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    t0 = time.perf_counter()
    ca = mc.write_tokenizer(kind, cfg, tmp_path / "a")
    assert time.perf_counter() - t0 < 3
    cb = mc.write_tokenizer(kind, cfg, tmp_path / "b")
    name = "tokenizer.json" if kind == "hf" else "tokenizer.model"
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() and ca == cb
    from llmc.runtime.tokenizer import from_files

    tok = from_files(tmp_path / "a" / name, fallback_bos=ca.bos_id)
    assert tok.vocab_size <= cfg.vocab_size
    assert max([ca.bos_id, *ca.eos_ids]) < cfg.vocab_size


@pytest.mark.parametrize("kind, message", [
    ("hf", "--tokenizer hf needs vocab_size >= 261"),
    ("tiktoken", "--tokenizer tiktoken needs vocab_size >= 512"),
    ("sentencepiece", "--tokenizer sentencepiece: vocab_size 256 of tiny is too small"),
    ("bpe", "tokenizer 'bpe' is not one of hf, tiktoken, sentencepiece"),
])
def test_tokenizer_too_small_a_vocabulary(tmp_path, kind, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        mc.write_checkpoint("tiny", "hf", tmp_path / "o", "f32", 0, tokenizer=kind)
    assert not (tmp_path / "o").exists() and leftovers(tmp_path) == []
