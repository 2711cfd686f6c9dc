"""Meta and Hugging Face Llama checkpoints through `load_checkpoint`: equal weights from both formats,
Meta's rotary layout converted correctly, memory-mapped tensors passed through, and every kind of
bad input reported as one InputError that names the file and the problem.

Checkpoints are written by tools/make_checkpoint.py (random weights, same seed = same weights in
both formats); the bad ones are made by editing a copy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from llmc.errors import InputError
from llmc.models.llama.config import get_config
from llmc.models.llama.loaders import (
    detect_format,
    hf_state_dict_to_meta,
    hf_to_meta_rotary,
    llama_param_shapes,
    load_checkpoint,
    meta_to_hf_rotary,
)
from llmc.tools.make_checkpoint import random_tensor, write_checkpoint

CONFIGS = ("tiny", "tiny-llama3")  # GQA 4:2 untied; GQA 4:1, rope scaling, tied


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """{(config, fmt): folder} written once: f32, seed 0 (plus a sharded HF and a bf16 pair of tiny)."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name in CONFIGS:
        for fmt in ("meta", "hf"):
            out[name, fmt] = write_checkpoint(name, fmt, root / f"{name}-{fmt}", "f32", 0)
    out["tiny", "hf-sharded"] = write_checkpoint("tiny", "hf", root / "tiny-hf-sharded", "f32", 0, shard_size_gb=1e-4)
    for fmt in ("meta", "hf"):
        out["tiny-bf16", fmt] = write_checkpoint("tiny", fmt, root / f"tiny-bf16-{fmt}", "bf16", 0)
    return out


def copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / src.name))


def assert_same_state(a: dict, b: dict):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


# ---- same weights from both formats --------------------------------------------------------------

@pytest.mark.parametrize("name", CONFIGS)
def test_meta_and_hf_load_to_identical_state(ckpts, name):
    cm, sm = load_checkpoint(ckpts[name, "meta"])
    ch, sh = load_checkpoint(ckpts[name, "hf"])
    assert cm == ch == get_config(name)
    assert list(sm) == list(llama_param_shapes(cm))
    assert ("lm_head.weight" in sm) == (not cm.tie_embeddings)
    assert_same_state(sm, sh)


def test_loaded_values_are_the_generated_ones(ckpts):
    # Guards against a writer and loader that agree with each other but not with the weights.
    _, s = load_checkpoint(ckpts["tiny", "meta"])
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.1.mlp.up_proj.weight", "model.norm.weight"):
        assert torch.equal(s[name], random_tensor(name, tuple(s[name].shape), torch.float32, 0)), name


def test_different_seed_gives_different_weights(ckpts, tmp_path):
    _, a = load_checkpoint(ckpts["tiny", "hf"])
    _, b = load_checkpoint(write_checkpoint("tiny", "hf", tmp_path / "s1", "f32", 1))
    assert not any(torch.equal(a[k], b[k]) for k in a)


def test_sharded_hf_and_pytorch_model_bin_load_the_same(ckpts, tmp_path):
    _, ref = load_checkpoint(ckpts["tiny", "hf"])
    sharded = ckpts["tiny", "hf-sharded"]
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1
    assert_same_state(load_checkpoint(sharded)[1], ref)
    assert_same_state(load_checkpoint(sharded / "config.json")[1], ref)
    assert_same_state(load_checkpoint(ckpts["tiny", "meta"] / "params.json")[1], ref)
    # One shard's path stands for the whole set.
    assert_same_state(load_checkpoint(next(sharded.glob("model-00002-of-*.safetensors")))[1], ref)
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(ckpts["tiny", "hf"] / "config.json", d)
    torch.save(dict(reversed(list(ref.items()))), d / "pytorch_model.bin")
    assert_same_state(load_checkpoint(d)[1], ref)


def test_dtype_conversion(ckpts):
    c16, s16 = load_checkpoint(ckpts["tiny-bf16", "meta"])
    assert {t.dtype for t in s16.values()} == {torch.bfloat16}
    for fmt in ("meta", "hf"):
        _, s32 = load_checkpoint(ckpts["tiny-bf16", fmt], dtype="f32")
        assert {t.dtype for t in s32.values()} == {torch.float32}
        for k in s16:
            assert torch.equal(s32[k], s16[k].float()), k
    _, s = load_checkpoint(ckpts["tiny-bf16", "hf"], dtype=torch.float16)
    assert s["model.norm.weight"].dtype == torch.float16
    with pytest.raises(InputError, match="dtype='int4' is not one of"):
        load_checkpoint(ckpts["tiny", "hf"], dtype="int4")


# ---- memory: mmap'd tensors passed through -------------------------------------------------------

def mapped_from(t: torch.Tensor, path: Path) -> bool:
    """Whether t's data lies in a memory mapping of `path` (Linux /proc/self/maps)."""
    ptr, target = t.data_ptr(), str(path.resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == target:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                return True
    return False


def test_tensors_are_memory_mapped_not_copied(ckpts):
    _, s = load_checkpoint(ckpts["tiny", "hf"])
    st = ckpts["tiny", "hf"] / "model.safetensors"
    assert all(mapped_from(t, st) for t in s.values())
    _, s = load_checkpoint(ckpts["tiny", "meta"])
    pth = ckpts["tiny", "meta"] / "consolidated.00.pth"
    unconverted = [k for k in s if not k.endswith(("q_proj.weight", "k_proj.weight"))]
    assert all(mapped_from(s[k], pth) for k in unconverted)
    assert not mapped_from(s["model.layers.0.self_attn.q_proj.weight"], pth)  # permuted: a new tensor
    _, s = load_checkpoint(ckpts["tiny", "hf"], dtype="bf16")
    assert not mapped_from(s["model.norm.weight"], st)  # converted: a new tensor


# ---- Meta rotary layout ------------------------------------------------------------------------------

def rope_freqs(hd: int, n: int, theta: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    return torch.outer(torch.arange(n, dtype=torch.float64), inv)  # (n, hd/2)


def rope_interleaved(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Meta's reference: rows (2i, 2i+1) of a head are one complex number, rotated by angle i."""
    t, h, hd = x.shape
    xc = torch.view_as_complex(x.reshape(t, h, hd // 2, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)[:, None, :]).reshape(t, h, hd)


def rope_rotate_half(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """HF's: row i pairs with row i + hd/2; cos/sin repeated over both halves."""
    hd = x.shape[-1]
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]
    rot = torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], dim=-1)
    return x * emb.cos() + rot * emb.sin()


def qk_scores(x, wq, wk, n_heads, n_kv, rope) -> torch.Tensor:
    t, d = x.shape
    hd = wq.shape[0] // n_heads
    angles = rope_freqs(hd, t)
    q = rope((x @ wq.T).view(t, n_heads, hd), angles)
    k = rope((x @ wk.T).view(t, n_kv, hd), angles).repeat_interleave(n_heads // n_kv, dim=1)
    return torch.einsum("qhd,khd->hqk", q, k)


@pytest.mark.parametrize("n_heads, n_kv, hd", [(4, 4, 16), (4, 2, 16), (8, 1, 8)])
def test_meta_to_hf_rotary_preserves_attention_scores(n_heads, n_kv, hd):
    g = torch.Generator().manual_seed(0)
    d = n_heads * hd
    x = torch.randn(12, d, generator=g, dtype=torch.float64)
    wq = torch.randn(n_heads * hd, d, generator=g, dtype=torch.float64)
    wk = torch.randn(n_kv * hd, d, generator=g, dtype=torch.float64)
    meta = qk_scores(x, wq, wk, n_heads, n_kv, rope_interleaved)
    hf = qk_scores(x, meta_to_hf_rotary(wq, n_heads), meta_to_hf_rotary(wk, n_kv), n_heads, n_kv, rope_rotate_half)
    torch.testing.assert_close(hf, meta, rtol=1e-10, atol=1e-9)
    # Without the conversion the scores differ (so the check above has teeth).
    wrong = qk_scores(x, wq, wk, n_heads, n_kv, rope_rotate_half)
    assert (wrong - meta).abs().max() > 1.0
    # Exact inverse, both ways.
    assert torch.equal(hf_to_meta_rotary(meta_to_hf_rotary(wq, n_heads), n_heads), wq)
    assert torch.equal(meta_to_hf_rotary(hf_to_meta_rotary(wk, n_kv), n_kv), wk)


@pytest.mark.parametrize("name", CONFIGS)
def test_loaded_meta_checkpoint_scores_match_meta_reference(ckpts, name):
    c, s = load_checkpoint(ckpts[name, "meta"], dtype="f32")
    raw = torch.load(ckpts[name, "meta"] / "consolidated.00.pth", weights_only=True)
    x = torch.randn(10, c.dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for i in range(c.n_layers):
        meta = qk_scores(x, raw[f"layers.{i}.attention.wq.weight"].double(), raw[f"layers.{i}.attention.wk.weight"].double(),
                         c.n_heads, c.n_kv_heads, rope_interleaved)
        hf = qk_scores(x, s[f"model.layers.{i}.self_attn.q_proj.weight"].double(), s[f"model.layers.{i}.self_attn.k_proj.weight"].double(),
                       c.n_heads, c.n_kv_heads, rope_rotate_half)
        torch.testing.assert_close(hf, meta, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", CONFIGS)
def test_meta_hf_meta_round_trip_is_exact(ckpts, name):
    c, s = load_checkpoint(ckpts[name, "meta"])
    raw = torch.load(ckpts[name, "meta"] / "consolidated.00.pth", weights_only=True)
    back = hf_state_dict_to_meta(s, c)
    assert sorted(back) == sorted(raw)
    for k in raw:
        assert torch.equal(back[k], raw[k]), k


def meta_reference_logits(raw: dict, c, tokens: list[int]) -> torch.Tensor:
    """Llama forward written the way Meta's reference code is (Meta names, interleaved RoPE), in f64."""
    w = {k: v.double() for k, v in raw.items()}
    t, hd = len(tokens), c.head_dim
    angles = rope_freqs(hd, t, c.rope_theta)

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * g

    x = w["tok_embeddings.weight"][tokens]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c.n_layers):
        L = lambda n: w[f"layers.{i}.{n}.weight"]  # noqa: E731
        h = rms(x, L("attention_norm"))
        q = rope_interleaved((h @ L("attention.wq").T).view(t, c.n_heads, hd), angles)
        k = rope_interleaved((h @ L("attention.wk").T).view(t, c.n_kv_heads, hd), angles)
        v = (h @ L("attention.wv").T).view(t, c.n_kv_heads, hd)
        k, v = (z.repeat_interleave(c.n_heads // c.n_kv_heads, dim=1) for z in (k, v))
        p = (torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask).softmax(-1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(t, -1) @ L("attention.wo").T
        h = rms(x, L("ffn_norm"))
        x = x + (F.silu(h @ L("feed_forward.w1").T) * (h @ L("feed_forward.w3").T)) @ L("feed_forward.w2").T
    return rms(x, w["norm.weight"]) @ w["output.weight"].T


def test_transformers_llama_on_loaded_meta_weights_matches_meta_reference(ckpts):
    """End to end: names (w1=gate, w3=up, w2=down), rotary permutation and config, through HF's own Llama."""
    transformers = pytest.importorskip("transformers")
    c, s = load_checkpoint(ckpts["tiny", "meta"])
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**c.to_hf_config(), attn_implementation="eager")).eval()
    model.load_state_dict(s, strict=True)
    tokens = [1, 17, 200, 3, 99, 42, 7, 255]
    with torch.no_grad():
        got = model(torch.tensor([tokens])).logits[0].double()
    raw = torch.load(ckpts["tiny", "meta"] / "consolidated.00.pth", weights_only=True)
    want = meta_reference_logits(raw, c, tokens)
    assert want.std() > 0.5  # well-separated logits, as the writer's init promises
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # The same model from the HF folder through transformers' own loader: identical weights.
    hf, info = transformers.LlamaForCausalLM.from_pretrained(ckpts["tiny", "hf"], output_loading_info=True, dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    sd = hf.state_dict()
    assert all(torch.equal(sd[k], s[k]) for k in s)


# ---- Meta shards and tying -----------------------------------------------------------------------

SPLIT = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1}


@pytest.mark.parametrize("emb_dim", [0, 1])  # Llama 3 splits the vocabulary, Llama 2 the embedding
def test_meta_model_parallel_shards_are_merged(ckpts, tmp_path, emb_dim):
    src = ckpts["tiny", "meta"]
    raw = torch.load(src / "consolidated.00.pth", weights_only=True)
    shards = [{}, {}]
    for k, t in raw.items():
        kind = k.split(".")[-2]
        dim = emb_dim if kind == "tok_embeddings" else SPLIT.get(kind)
        parts = t.chunk(2, dim=dim) if dim is not None else (t, t)
        for sh, p in zip(shards, parts):
            sh[k] = p.clone()
    d = tmp_path / "mp2"
    d.mkdir()
    shutil.copy(src / "params.json", d)
    for i, sh in enumerate(shards):
        torch.save(sh, d / f"consolidated.{i:02d}.pth")
    assert detect_format(d) == "meta"
    assert_same_state(load_checkpoint(d)[1], load_checkpoint(src)[1])
    assert_same_state(load_checkpoint(d / "consolidated.01.pth")[1], load_checkpoint(src)[1])
    (d / "consolidated.00.pth").unlink()
    with pytest.raises(InputError, match=r"shards are incomplete.*missing consolidated\.00\.pth"):
        load_checkpoint(d)


def edit_meta(folder: Path, *, params=None, tensors=None):
    """Rewrite a Meta checkpoint: params.json updated with `params`, tensors through `tensors(sd)`."""
    if params is not None:
        p = json.loads((folder / "params.json").read_text())
        p.update(params)
        p = {k: v for k, v in p.items() if v is not None}
        (folder / "params.json").write_text(json.dumps(p))
    if tensors is not None:
        sd = torch.load(folder / "consolidated.00.pth", weights_only=True)
        tensors(sd)
        torch.save(sd, folder / "consolidated.00.pth")
    return folder


def edit_hf(folder: Path, *, config=None, tensors=None):
    if config is not None:
        c = json.loads((folder / "config.json").read_text())
        c.update(config)
        c = {k: v for k, v in c.items() if v is not None}
        (folder / "config.json").write_text(json.dumps(c))
    if tensors is not None:
        sd = load_file(folder / "model.safetensors")
        tensors(sd)
        save_file(sd, folder / "model.safetensors")
    return folder


def test_meta_tied_embeddings(ckpts, tmp_path):
    src = ckpts["tiny", "meta"]
    _, ref = load_checkpoint(src)
    # No `output` and no tying flag in params.json (Meta's own params.json has none): tied.
    d = edit_meta(copy(src, tmp_path), params={"tie_embeddings": None}, tensors=lambda sd: sd.pop("output.weight"))
    c, s = load_checkpoint(d)
    assert c.tie_embeddings and "lm_head.weight" not in s
    assert torch.equal(s["model.embed_tokens.weight"], ref["model.embed_tokens.weight"])
    # params.json says untied: a missing `output` is an error.
    edit_meta(d, params={"tie_embeddings": False})
    with pytest.raises(InputError, match=r"1 missing: output\.weight"):
        load_checkpoint(d)
    # Tied with a redundant `output` copy of the right shape: accepted, lm_head dropped.
    c, s = load_checkpoint(ckpts["tiny-llama3", "meta"])
    d2 = edit_meta(copy(ckpts["tiny-llama3", "meta"], tmp_path / "x"),
                   tensors=lambda sd: sd.__setitem__("output.weight", sd["tok_embeddings.weight"].clone()))
    assert_same_state(load_checkpoint(d2)[1], s)


# ---- bad input -------------------------------------------------------------------------------------

def expect_error(path, *patterns) -> str:
    with pytest.raises(InputError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert e.value.exit_code == 2
    for p in patterns:
        assert p in msg, f"{p!r} not in: {msg}"
    assert "Traceback" not in msg and len(msg) < 2500
    return msg


def test_missing_params_json(ckpts, tmp_path):
    d = copy(ckpts["tiny", "meta"], tmp_path)
    (d / "params.json").unlink()
    for p in (d, d / "consolidated.00.pth"):
        expect_error(p, f"{d / 'params.json'}: not found", "consolidated.00.pth", "copy it there")


def test_missing_config_json(ckpts, tmp_path):
    d = copy(ckpts["tiny", "hf"], tmp_path)
    (d / "config.json").unlink()
    for p in (d, d / "model.safetensors"):
        expect_error(p, f"{d / 'config.json'}: not found", "model.safetensors")


def test_wrong_n_heads_in_params_json(ckpts, tmp_path):
    # tiny: dim 64, n_heads 4, n_kv_heads 2. With n_heads 8 the head is 8 wide, so wk/wv shrink.
    d = edit_meta(copy(ckpts["tiny", "meta"], tmp_path), params={"n_heads": 8})
    expect_error(d, "consolidated.00.pth", "params.json", "mis-shaped", "layers.0.attention.wk.weight is (32, 64), expected (16, 64)",
                 "n_heads=8", "check them in")


def test_wrong_n_heads_caught_by_rope_freqs_when_shapes_agree(tmp_path):
    # Without GQA every weight shape is the same for any head count; Llama 2's rope.freqs still tells.
    mha = get_config("tiny").replace(n_kv_heads=4, name="tiny-mha")
    d = write_checkpoint(mha, "meta", tmp_path / "mha", "f32", 0)
    edit_meta(d, tensors=lambda sd: sd.__setitem__("rope.freqs", torch.ones(mha.head_dim // 2)))
    assert load_checkpoint(d)[0] == mha  # rope.freqs is known and ignored
    edit_meta(d, params={"n_heads": 8, "n_kv_heads": 8})
    expect_error(d, "rope.freqs has 8 entries, so head_dim is 16", "head_dim = dim / n_heads = 64 / 8 = 8", "should be 4")


def test_wrong_n_heads_in_config_json(ckpts, tmp_path):
    d = edit_hf(copy(ckpts["tiny", "hf"], tmp_path), config={"num_attention_heads": 8, "head_dim": None})
    expect_error(d, "model.safetensors", "config.json", "model.layers.1.self_attn.v_proj.weight is (32, 64), expected (16, 64)")


def test_missing_key(ckpts, tmp_path):
    d = edit_meta(copy(ckpts["tiny", "meta"], tmp_path), tensors=lambda sd: sd.pop("layers.1.feed_forward.w2.weight"))
    expect_error(d, "consolidated.00.pth", "1 missing: layers.1.feed_forward.w2.weight")
    d = edit_hf(copy(ckpts["tiny", "hf"], tmp_path / "hf"), tensors=lambda sd: sd.pop("lm_head.weight"))
    expect_error(d, "model.safetensors", "1 missing: lm_head.weight")


def test_unexpected_key(ckpts, tmp_path):
    d = edit_meta(copy(ckpts["tiny", "meta"], tmp_path), tensors=lambda sd: sd.__setitem__("layers.0.attention.wq.bias", torch.zeros(64)))
    expect_error(d, "1 unexpected: layers.0.attention.wq.bias")
    d = edit_hf(copy(ckpts["tiny", "hf"], tmp_path / "hf"),
                tensors=lambda sd: sd.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.zeros(64)))
    expect_error(d, "1 unexpected: model.layers.0.self_attn.q_proj.bias")


def test_mis_shaped_tensor(ckpts, tmp_path):
    d = edit_meta(copy(ckpts["tiny", "meta"], tmp_path), tensors=lambda sd: sd.__setitem__("norm.weight", torch.ones(65)))
    expect_error(d, "1 mis-shaped: norm.weight is (65,), expected (64,)")
    d = edit_hf(copy(ckpts["tiny", "hf"], tmp_path / "hf"),
                tensors=lambda sd: sd.__setitem__("model.layers.0.mlp.up_proj.weight", torch.ones(64, 176)))
    expect_error(d, "model.layers.0.mlp.up_proj.weight is (64, 176), expected (176, 64)")


def test_all_problems_in_one_message_truncated(ckpts, tmp_path):
    d = edit_meta(copy(ckpts["tiny", "meta"], tmp_path), params={"n_layers": 12},
                  tensors=lambda sd: (sd.pop("norm.weight"), sd.__setitem__("extra", torch.zeros(1))))
    msg = expect_error(d, "91 missing: layers.2.attention.wq.weight", "... and 83 more", "1 unexpected: extra",
                       "the checkpoint has layers 0..1 but", "n_layers=12")
    assert msg.count("layers.") == 8  # 8 names listed, then only the count


@pytest.mark.parametrize("cut", ["half", "tail"])
def test_truncated_pth(ckpts, tmp_path, cut):
    d = copy(ckpts["tiny", "meta"], tmp_path)
    f = d / "consolidated.00.pth"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if cut == "half" else data[:-10])
    expect_error(d, str(f), "truncated or corrupt")


@pytest.mark.parametrize("cut", ["half", "tail", "header"])
def test_truncated_safetensors(ckpts, tmp_path, cut):
    d = copy(ckpts["tiny", "hf"], tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"half": data[: len(data) // 2], "tail": data[:-10], "header": data[:100]}[cut])
    expect_error(d, str(f), "truncated or corrupt")


def test_sharded_index_pointing_to_missing_shard(ckpts, tmp_path):
    d = copy(ckpts["tiny", "hf-sharded"], tmp_path)
    gone = sorted(d.glob("model-*.safetensors"))[1]
    gone.unlink()
    expect_error(d, "model.safetensors.index.json", "do not exist", gone.name)


def test_sharded_index_disagreeing_with_shards(ckpts, tmp_path):
    d = copy(ckpts["tiny", "hf-sharded"], tmp_path)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first, last = sorted(set(index["weight_map"].values()))[0], sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"]["model.norm.weight"] = first  # it lives in the last shard
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    expect_error(d, f"maps 1 tensor(s) to {first} that it does not hold: model.norm.weight")


def test_pickled_code_is_refused(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    (d / "params.json").write_text(json.dumps(get_config("tiny").to_meta_params()))
    torch.save({"tok_embeddings.weight": torch.zeros(2), "note": Path("x")}, d / "consolidated.00.pth")
    expect_error(d, "consolidated.00.pth", "weights_only=True", "never runs code")


def test_not_a_checkpoint(tmp_path):
    expect_error(tmp_path, "not a Llama checkpoint")
    expect_error(tmp_path / "nope", "no such file or directory")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    expect_error(tmp_path, "no weights found")


# ---- format detection ------------------------------------------------------------------------------

def test_detect_format(ckpts, tmp_path):
    assert detect_format(ckpts["tiny", "meta"]) == "meta"
    assert detect_format(ckpts["tiny", "meta"] / "consolidated.00.pth") == "meta"
    assert detect_format(ckpts["tiny", "hf"]) == "hf"
    assert detect_format(ckpts["tiny", "hf"] / "model.safetensors") == "hf"
    assert detect_format(ckpts["tiny", "hf-sharded"]) == "hf"
    assert detect_format(ckpts["tiny", "hf-sharded"] / "model.safetensors.index.json") == "hf"
    # A Meta .pth on its own (no params.json) is still recognised by its names; any other .pt is not claimed.
    shutil.copy(ckpts["tiny", "meta"] / "consolidated.00.pth", tmp_path / "weights.pth")
    assert detect_format(tmp_path / "weights.pth") == "meta"
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pt")
    assert detect_format(tmp_path / "other.pt") is None
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not really")
    assert detect_format(tmp_path / "junk.pt") is None
    assert detect_format(tmp_path / "missing") is None
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, mistral / "model.safetensors")
    assert detect_format(mistral) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert detect_format(empty) is None


# ---- a bare weights file with --config -------------------------------------------------------------

@pytest.mark.parametrize("fmt, weights", [("meta", "consolidated.00.pth"), ("hf", "model.safetensors")])
def test_bare_weights_file_loads_with_a_named_or_file_config(tmp_path, fmt, weights):
    from llmc.tools.make_checkpoint import write_checkpoint

    ck = write_checkpoint("tiny", fmt, tmp_path / "ck", dtype="f32", seed=4)
    ref_config, ref = load_checkpoint(ck)
    bare_dir = tmp_path / "bare"
    bare_dir.mkdir()
    bare = bare_dir / ("weights.pt" if fmt == "meta" else "weights.safetensors")
    shutil.copy(ck / weights, bare)

    with pytest.raises(InputError, match="--config"):
        load_checkpoint(bare)  # nothing beside it: the error names the flag
    cfg_file = ck / ("params.json" if fmt == "meta" else "config.json")
    for spec in ("tiny", cfg_file):
        config, state = load_checkpoint(bare, config=spec)
        assert (config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size) == (
            ref_config.dim, ref_config.n_layers, ref_config.n_heads, ref_config.n_kv_heads, ref_config.vocab_size)
        assert list(state) == list(ref)
        for name in ref:  # Meta names and rotary layout converted exactly as from the folder
            assert torch.equal(state[name], ref[name]), name


def test_config_errors(tmp_path):
    from llmc.tools.make_checkpoint import write_checkpoint

    ck = write_checkpoint("tiny", "hf", tmp_path / "ck", dtype="f32", seed=4)
    with pytest.raises(InputError, match="unknown Llama config 'llama9'"):
        load_checkpoint(ck / "model.safetensors", config="llama9")
    with pytest.raises(InputError, match="no such file"):
        load_checkpoint(ck / "model.safetensors", config=tmp_path / "missing.json")
    with pytest.raises(InputError, match="single weights file"):
        load_checkpoint(ck, config="tiny")
    with pytest.raises(InputError, match=r"do not match config tiny-llama3.*model.embed_tokens.weight is \(256, 64\), expected \(512, 64\)"):
        load_checkpoint(ck / "model.safetensors", config="tiny-llama3")  # shapes do not fit that config
