"""Prefill buckets (--prefill-buckets): static-length prefill entry points, the prompt padded at the end.

Checked against `transformers` LlamaForCausalLM on the same HF checkpoint (greedy tokens identical in
f32) and against the module's own dynamic prefill (logits and the cache's prompt positions, max |diff|
/ max |ref| <= 1e-5, the f32 profile of compiler/diff_metrics.py).
"""

import json

import numpy as np
from llmc.dtypes import by_name
import pytest
import torch
from conftest import hf_greedy, llmc_in_process, vulkan_or_skip

transformers = pytest.importorskip("transformers")

import llmc  # noqa: E402
from llmc.errors import UsageError  # noqa: E402
from llmc.models.llama.config import get_config  # noqa: E402
from llmc.runtime.generate import choose_bucket  # noqa: E402
from llmc.tools.make_checkpoint import write_checkpoint  # noqa: E402

MAX_SEQ = 128
BUCKETS = (16, 64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("buckets")
    config = get_config("tiny")  # seed 3: varied greedy runs for every prompt below
    write_checkpoint(config, "hf", root / "hf", dtype="f32", seed=3)
    hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", torch_dtype=torch.float32).eval()
    art = llmc.compile(root / "hf", output=root / "b.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=BUCKETS)
    return root, config, hf, llmc.load(art)


def _prompt(n, vocab):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(100 + n)).tolist()


def test_manifest_records_the_buckets(setup):
    _, _, _, mod = setup
    llm = mod.manifest["llm"]
    assert [b["tokens"] for b in llm["prefill_buckets"]] == list(BUCKETS)
    assert llm["prefill_bucket_min_fill"] == 0.8  # cpu: pads cost compute there
    # a cache of 128 holds two of cpu's default chunk (--prefill-chunk auto): buckets first, chunks for longer prompts
    assert llm["prefill_chunk"]["tokens"] == 64
    for b in llm["prefill_buckets"]:
        shapes = [i["shape"] for i in mod.manifest["entry_points"][b["function"]]["inputs"]]
        assert shapes[0] == [1, b["tokens"]] and shapes[1] == [1]  # static: no dynamic dimension


@pytest.mark.parametrize("n, entry", [(16, "prefill_16"), (14, "prefill_16"), (60, "prefill_64"), (40, "prefill"), (1, "decode"),
                                      (70, "prefill_chunk")])
def test_generate_pads_into_the_bucket_and_matches_transformers(setup, n, entry):
    _, config, hf, mod = setup
    prompt = _prompt(n, config.vocab_size)
    got = mod.generate(prompt, 24, stop_at_eos=False)
    assert mod.last_generation.prefill_function == entry
    want = hf_greedy(hf, prompt, 24)
    assert len(set(want)) > 3, "degenerate reference: pick another seed"
    assert got == want


@pytest.mark.parametrize("n", [2, 9, 16])
def test_bucket_logits_and_cache_equal_the_dynamic_prefill(setup, n):
    _, config, _, mod = setup
    spec = mod.manifest["llm"]["cache"]
    zeros = [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    prompt = np.asarray([_prompt(n, config.vocab_size)], dtype=np.int64)
    padded = np.zeros((1, 16), dtype=np.int64)
    padded[0, :n] = prompt[0]
    dyn = [mod.host(x) for x in mod.entry_points["prefill"].call_raw([prompt, *zeros])]
    zeros = [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    bkt = [mod.host(x) for x in mod.entry_points["prefill_16"].call_raw([padded, np.asarray([n], dtype=np.int64), *zeros])]
    rel = np.abs(bkt[0] - dyn[0]).max() / np.abs(dyn[0]).max()
    assert rel <= 1e-5, f"logits of position {n - 1}: max rel {rel:.3g}"
    for got, want in zip(bkt[1:], dyn[1:]):
        # positions < n hold the prompt's K/V in both; the bucket also wrote its pads' at n..15
        assert np.abs(got[:, :, :n] - want[:, :, :n]).max() <= 1e-5 * max(np.abs(want).max(), 1e-30)
        assert np.all(want[:, :, n:] == 0)


def test_choose_bucket():
    b = [{"function": "prefill_16", "tokens": 16}, {"function": "prefill_64", "tokens": 64}]
    pick = lambda n, fill: (choose_bucket(b, n, fill) or {}).get("function")
    assert pick(16, 0.8) == "prefill_16" and pick(13, 0.8) == "prefill_16" and pick(12, 0.8) is None
    assert pick(17, 0.0) == "prefill_64" and pick(2, 0.0) == "prefill_16"
    assert pick(65, 0.0) is None  # longer than every bucket: the dynamic prefill
    assert choose_bucket([], 5, 0.0) is None


def test_gpu_targets_get_buckets_by_default(setup, tmp_path):
    root, *_ = setup
    art = llmc.compile(root / "hf", target="hip", dtype="f16", output=tmp_path / "g.vmfb", max_seq_len=256)
    m = art.read_manifest()
    assert [b["tokens"] for b in m["llm"]["prefill_buckets"]] == [128]  # 512 and 2048 exceed max_seq_len 256
    assert m["llm"]["prefill_bucket_min_fill"] == 0.0
    assert m["entry_points"]["prefill_128"]["inputs"][0]["shape"] == [1, 128]
    info = llmc_in_process("info", tmp_path / "g.vmfb")
    assert "prefill:  buckets 128 tokens" in info.stdout, info.stdout + info.stderr


# cpu gets no buckets by default: tests/e2e/test_llama_generate.py::test_cpu_defaults_add_no_buckets_and_no_static_decode
# (a default cpu build that file makes anyway).


@pytest.mark.parametrize("value, needle, extra", [
    ("abc", "give auto, none, or prompt sizes", []),
    ("1", "at least 2 tokens", []),
    ("64,512", "512 exceed the KV cache (--max-seq-len 128)", []),
    ("64", "not available on cpu with --iree-flag=--iree-dispatch-creation-enable-aggressive-fusion",
     ["--iree-flag=--iree-dispatch-creation-enable-aggressive-fusion=True"]),
])
def test_bad_buckets_are_refused_with_one_line(setup, tmp_path, value, needle, extra):
    root, *_ = setup
    r = llmc_in_process("compile", root / "hf", "--max-seq-len", "128", "--prefill-buckets", value, *extra, "-o", tmp_path / "x.vmfb")
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert [l for l in lines if l.startswith("llmc: error")] == lines[-1:]
    if value in ("abc", "1"):  # a malformed value answers before the checkpoint is read; the others need the target or config
        assert len(lines) == 1
    assert not list(tmp_path.iterdir())


def test_buckets_refused_with_tensor_parallel_and_for_plain_models(setup, tmp_path):
    root, *_ = setup
    with pytest.raises(UsageError, match="not available with --tensor-parallel"):
        llmc.compile(root / "hf", output=tmp_path / "tp.vmfb", max_seq_len=MAX_SEQ, tensor_parallel=2, prefill_buckets=(16,))
    with pytest.raises(UsageError, match="--prefill-buckets applies to Llama checkpoints"):
        llmc.compile(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), output=tmp_path / "lin.vmfb", prefill_buckets=(16,))
    # the Python API validates sizes as the CLI does (targets.parse_buckets), before the checkpoint is read
    with pytest.raises(UsageError, match="each size must be at least 2 tokens"):
        llmc.compile(root / "hf", output=tmp_path / "one.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=(16, 1))
    with pytest.raises(UsageError, match="give auto, none, or prompt sizes"):
        llmc.compile(root / "hf", output=tmp_path / "bad.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=("a",))
    assert not list(tmp_path.iterdir())


def test_vulkan_f32_bucket_matches_transformers_on_lavapipe(setup, tmp_path):
    """SPIR-V gets no buckets by default; asked for in f32 they compile and run right (lavapipe)."""
    vulkan_or_skip(lock=False)  # compiles first: exclusive from the first Vulkan device it opens (conftest)
    root, config, hf, _ = setup
    assert llmc.compile(root / "hf", target="vulkan", output=tmp_path / "auto.vmfb", max_seq_len=MAX_SEQ).read_manifest()["llm"]["prefill_buckets"] == []
    art = llmc.compile(root / "hf", target="vulkan", output=tmp_path / "v.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=(64,))
    mod = llmc.load(art)
    prompt = _prompt(40, config.vocab_size)  # 40 of 64: a GPU pads any prompt that fits
    got = mod.generate(prompt, 16, stop_at_eos=False)
    assert mod.last_generation.prefill_function == "prefill_64"
    assert got == hf_greedy(hf, prompt, 16)


def test_spirv_f16_buckets_are_refused(setup, tmp_path):
    root, *_ = setup
    for target in ("vulkan", "xpu"):
        with pytest.raises(UsageError, match="not available on .* with f16 math"):
            llmc.compile(root / "hf", target=target, dtype="f16", output=tmp_path / "v.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=(64,))


# bf16/fp8/int8 weights on cpu, a bucket against the dynamic prefill of the same module:
# tests/e2e/test_narrow_decode.py::test_cpu_narrow_dtype_bucket_matches_its_dynamic_prefill (the build that
# file makes of each dtype for its kernels check serves both).


def test_cpu_buckets_with_aggressive_fusion_are_refused(setup, tmp_path):
    """IREE 3.13 fails on a static-length prefill under aggressive fusion (any dtype): refused in one line."""
    root, *_ = setup
    with pytest.raises(UsageError, match="not available on cpu with --iree-flag=--iree-dispatch-creation-enable-aggressive-fusion"):
        llmc.compile(root / "hf", dtype="f32", output=tmp_path / "n.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=(16,),
                     extra_iree_flags=("--iree-dispatch-creation-enable-aggressive-fusion",))
    assert not (tmp_path / "n.vmfb").exists()


def test_llmc_diff_checks_every_bucket_the_prompt_fits(setup, tmp_path):
    root, *_ = setup
    vmfb = root / "b.vmfb"
    r = llmc_in_process("diff", root / "hf", vmfb, "--seq", "20", "--steps", "2", "--json", tmp_path / "d.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "prefill_64.logits" in r.stdout and "prefill_16.logits" not in r.stdout  # 20 tokens do not fit 16
    outputs = json.dumps(json.loads((tmp_path / "d.json").read_text()))
    assert "prefill_64.logits" in outputs
