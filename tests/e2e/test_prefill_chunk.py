"""The prefill chunk (--prefill-chunk): C prompt tokens after the cached ones, C fixed, the cache length dynamic.

A prompt of P >= C tokens is prefilled P mod C tokens by the dynamic prefill (one token: a decode step)
and then C at a time. Checked against `transformers` LlamaForCausalLM on the same HF checkpoint (greedy
tokens identical in f32) for every way a prompt splits, and against the module's own dynamic prefill
(logits and the cache's prompt rows, max |diff| / max |ref| <= 1e-5, the f32 profile of
compiler/diff_metrics.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from llmc.dtypes import by_name
import pytest
import torch
from conftest import hf_greedy, llmc_in_process

transformers = pytest.importorskip("transformers")

import llmc  # noqa: E402
from llmc.compiler import llm, targets, ukernels  # noqa: E402
from llmc.errors import UsageError  # noqa: E402
from llmc.models.llama.config import get_config  # noqa: E402
from llmc.models.llama.model import LlamaPrefill, LlamaPrefillChunk, init_random, new_cache  # noqa: E402
from llmc.passes import _packed  # noqa: E402
from llmc.tools.make_checkpoint import write_checkpoint  # noqa: E402

MAX_SEQ = 48
CHUNK = 8
ARCH = "x86-64-v3"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunk")
    config = get_config("tiny")
    write_checkpoint(config, "hf", root / "hf", dtype="f32", seed=3)
    hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", torch_dtype=torch.float32).eval()
    # AVX2 code (x86-64-v3): the chunk's f32 products are llmc's C kernel calls on any x86-64 CPU this runs on
    # (with AVX-512 in every CPU of the module, IREE's own matmul serves instead: ukernels.f32_gemm_unavailable)
    art = llmc.compile(root / "hf", output=root / "c.vmfb", max_seq_len=MAX_SEQ, prefill_chunk=CHUNK, arch=ARCH)
    return root, config, hf, llmc.load(art)


def _prompt(n, vocab):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(200 + n)).tolist()


def test_eager_chunks_equal_one_prefill():
    """The model itself: a prefill of 5 tokens then two chunks of 8 give the logits and cache of one prefill of 21."""
    config = get_config("tiny")
    model = init_random(config, seed=1, rope_positions=32)
    ids = torch.randint(0, config.vocab_size, (1, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = LlamaPrefill(model)(ids, *new_cache(config, 32))
        out = LlamaPrefill(model)(ids[:, :5], *new_cache(config, 32))
        for end in (13, 21):
            out = LlamaPrefillChunk(model)(ids[:, end - 8:end], torch.ones(1, end, dtype=torch.int64), *out[1:])
    torch.testing.assert_close(out[0], whole[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(out[1:], whole[1:]):
        torch.testing.assert_close(got[:, :, :21], want[:, :, :21], rtol=1e-5, atol=1e-5)
    # the chunk's mask matters: without the positions before it, the logits differ
    with torch.no_grad():
        alone = LlamaPrefillChunk(model)(ids[:, 13:21], torch.ones(1, 8, dtype=torch.int64), *new_cache(config, 32))
    assert not torch.allclose(alone[0], whole[0], atol=1e-3)


def test_chunk_products_are_the_f32_kernel_and_weights_are_stored_once(setup):
    """f32-gemm-weights: every linear weight stored in 16-channel panels (the .irpa holds each once), the
    chunk's products llmc::gemm_f32 calls, every other program reading the weights unpacked (the numerics
    tests here check both against the dynamic prefill and transformers)."""
    root, config, _, mod = setup
    stats = {p["name"]: p for p in mod.manifest["passes"]}
    if ukernels.f32_gemm_unavailable(targets.resolve("cpu", ARCH, "f32")) is not None:
        assert "f32-gemm-weights" in {p["name"] for p in mod.manifest["passes_skipped"]}
        pytest.skip("llmc's cpu kernels do not serve this machine")
    forms = stats["f32-gemm-weights"]["forms"]
    # q, k, v, o, gate, up, down of every layer but the last, which runs only its last position past k and v
    # (models/llama/model.py LlamaPrefill): its other five products have one row, not a kernel call
    linears = (config.n_layers - 1) * 7 + 2
    assert forms.get("packed, 1 fixed many-row product(s) as C kernel calls") == linears, forms
    assert mod.manifest["target"]["pass_options"]["fixed_row_products"] is True
    # the .irpa: each weight once, its bytes the checkpoint's weight in 16-channel panels
    from safetensors.torch import load_file

    dump = subprocess.run([str(Path(sys.executable).parent / "iree-dump-parameters"), f"--parameters={root / 'c.irpa'}"],
                          capture_output=True, text=True, check=True).stdout
    name = "model.layers.0.mlp.down_proj.weight"
    rows = [line.split("|") for line in dump.splitlines() if f"`{name}`" in line]
    assert len(rows) == 1, dump
    start, end = int(rows[0][0].strip()), int(rows[0][1].strip())
    w = next(t for f in sorted((root / "hf").glob("*.safetensors")) for k, t in load_file(f).items() if k == name)
    with open(root / "c.irpa", "rb") as f:
        f.seek(start)
        stored = np.frombuffer(f.read(end - start), dtype=np.float32)
    assert np.array_equal(stored, _packed.pack(w.float(), 16).numpy().reshape(-1))


def test_manifest_records_the_chunk(setup):
    root, _, _, mod = setup
    m = mod.manifest
    assert m["llm"]["prefill_chunk"] == {"function": "prefill_chunk", "tokens": CHUNK, "mask_arg": 1, "cache_args_start": 2}
    tokens, mask = m["entry_points"]["prefill_chunk"]["inputs"][:2]
    assert tokens["shape"] == [1, CHUNK]  # static: every matmul has a static M
    assert mask["shape"][0] == 1 and mask["shape"][1]["min"] == CHUNK and mask["shape"][1]["max"] == MAX_SEQ
    info = llmc_in_process("info", root / "c.vmfb")
    assert f"prefill:  chunks of {CHUNK} tokens" in info.stdout, info.stdout + info.stderr
    # where llmc's C kernels serve, the chunk's attention is their call (passes/chunk_attention_kernel.py), so
    # the tests below check that kernel against transformers and the dynamic prefill
    rewrote = {p["name"]: p.get("rewrote") for p in m["passes"]}.get("chunk-attention-kernel")
    if ukernels.unavailable(targets.resolve("cpu", ARCH, "f32")) is None:
        assert rewrote, m["passes"]


@pytest.mark.parametrize("n, entry", [(5, "prefill"), (8, "prefill_chunk"), (9, "prefill_chunk"), (19, "prefill_chunk")])
def test_generate_runs_the_chunks_and_matches_transformers(setup, n, entry):
    """5: shorter than a chunk (the dynamic prefill); 8: one chunk and nothing before it; 9: a decode step at
    position 0, then a chunk; 19: the dynamic prefill of 3, then two chunks."""
    _, config, hf, mod = setup
    prompt = _prompt(n, config.vocab_size)
    got = mod.generate(prompt, 16, stop_at_eos=False)
    assert mod.last_generation.prefill_function == entry
    want = hf_greedy(hf, prompt, 16)
    assert len(set(want)) > 3, "degenerate reference: pick another seed"
    assert got == want


@pytest.mark.parametrize("n", [16, 19, 25])
def test_chunks_give_the_logits_and_cache_of_the_dynamic_prefill(setup, n):
    _, config, _, mod = setup
    spec = mod.manifest["llm"]["cache"]
    zeros = lambda: [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    prompt = np.asarray([_prompt(n, config.vocab_size)], dtype=np.int64)
    dyn = [mod.host(x) for x in mod.entry_points["prefill"].call_raw([prompt, *zeros()])]
    out = mod.entry_points["prefill"].call_raw([prompt[:, :n % CHUNK], *zeros()]) if n % CHUNK else [None, *zeros()]
    for end in range(n % CHUNK + CHUNK, n + 1, CHUNK):
        out = mod.entry_points["prefill_chunk"].call_raw([prompt[:, end - CHUNK:end], np.ones((1, end), dtype=np.int64), *out[1:]])
    got = [mod.host(x) for x in out]
    rel = np.abs(got[0] - dyn[0]).max() / np.abs(dyn[0]).max()
    assert rel <= 1e-5, f"logits of position {n - 1}: max rel {rel:.3g}"
    for g, w in zip(got[1:], dyn[1:]):
        assert np.abs(g[:, :, :n] - w[:, :, :n]).max() <= 1e-5 * np.abs(w).max()
        assert np.all(g[:, :, n:] == 0)  # nothing written past the prompt: no padding


def test_llmc_diff_checks_the_chunk(setup, tmp_path):
    root, *_ = setup
    r = llmc_in_process("diff", root / "hf", root / "c.vmfb", "--seq", "12", "--steps", "1", "--json", tmp_path / "d.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "prefill_chunk.logits" in r.stdout
    report = json.loads((tmp_path / "d.json").read_text())
    assert "prefill_chunk.logits" in json.dumps(report)


def _target(name="cpu", flags=()):
    return targets.resolve(name, None, "f32" if name == "cpu" else "f16", extra_flags=tuple(flags))


def test_auto_is_a_cpu_chunk_when_the_cache_holds_two():
    c = llm.CPU_PREFILL_CHUNK
    assert llm.resolve_chunk("auto", _target(), 2 * c, 1) == c
    assert llm.resolve_chunk("auto", _target(), 2 * c - 1, 1) == 0
    assert llm.resolve_chunk("auto", _target(), 4096, 2) == 0  # tensor parallel: not yet
    assert llm.resolve_chunk("auto", _target(flags=["--iree-dispatch-creation-enable-aggressive-fusion=true"]), 4096, 1) == 0
    for gpu in ("vulkan", "cuda", "hip"):
        assert llm.resolve_chunk("auto", _target(gpu), 4096, 1) == 0  # GPUs prefill through buckets
    assert llm.resolve_chunk("none", _target(), 4096, 1) == 0 and llm.resolve_chunk("0", _target(), 4096, 1) == 0
    assert llm.resolve_chunk(32, _target(), 64, 1) == 32


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int8"])
def test_auto_chunks_narrow_weights_only_where_the_kernels_serve(monkeypatch, dtype):
    """Packed narrow weights go through llmc's many-row kernel in a chunk; without it a chunk would widen
    every weight again, so auto leaves the chunk out (an explicit size is still taken)."""
    target = targets.resolve("cpu", "x86-64-v3", dtype)
    monkeypatch.setenv(ukernels.ENV, "off")
    assert llm.resolve_chunk("auto", target, 4096, 1) == 0
    assert llm.resolve_chunk(32, target, 4096, 1) == 32
    monkeypatch.delenv(ukernels.ENV)
    if ukernels.unavailable(target) is None:
        assert llm.resolve_chunk("auto", target, 4096, 1) == llm.CPU_PREFILL_CHUNK


@pytest.mark.parametrize("spec, target, max_len, tp, needle", [
    ("abc", "cpu", 64, 1, "give auto, none, or a chunk size of at least 2"),
    ("1", "cpu", 64, 1, "give auto, none, or a chunk size of at least 2"),
    (64, "cpu", 64, 1, "must be less than the KV cache (--max-seq-len 64)"),
    (16, "cuda", 64, 1, "cpu only for now"),
    (16, "cpu", 64, 2, "not available with --tensor-parallel"),
])
def test_bad_chunks_are_refused(spec, target, max_len, tp, needle):
    with pytest.raises(UsageError, match=None) as e:
        llm.resolve_chunk(spec, _target(target), max_len, tp)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cli_refuses_a_bad_chunk_before_reading_the_checkpoint(setup, tmp_path):
    root, *_ = setup
    r = llmc_in_process("compile", root / "hf", "--prefill-chunk", "x", "-o", tmp_path / "x.vmfb")
    assert r.returncode == 2 and "--prefill-chunk=x" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a refusal that needs the target (a GPU): exit 2, one line, before anything is exported or written
    r = llmc_in_process("compile", root / "hf", "--target", "cuda", "--dtype", "f16", "--prefill-chunk", "16", "-o", tmp_path / "g.vmfb")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("llmc: error") and "--prefill-chunk: cpu only for now" in r.stderr
    with pytest.raises(UsageError, match="--prefill-chunk applies to Llama checkpoints"):
        llmc.compile(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), output=tmp_path / "lin.vmfb", prefill_chunk=16)
    assert not list(tmp_path.iterdir())
