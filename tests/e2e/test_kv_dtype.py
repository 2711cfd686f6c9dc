"""--kv-dtype bf16 on cpu: the KV cache stored in bf16 under f32 math.

K/V rows are rounded to bf16 (nearest even) as they are written and widened exactly as attention reads
them (models/llama/model.py `stored`, `read`); a decode step's attention is llmc's bf16 C kernel over
the bf16 cache itself (passes/decode_attention_kernel.py). Checked against eager PyTorch running the
same model with a bf16 cache, within llmc diff's kv-bf16 profile (compiler/diff_metrics.py: max |diff| /
max |ref| <= 1e-2): the f32 arithmetic differs in its last bits, so a K/V value at a bf16 rounding
boundary can round the other way on one side (one bf16 step, in a few elements); the caches may differ
only so. The module must also be closer to that eager than to eager with an f32 cache (the rounding is
real, so the comparison is not vacuous), and its greedy tokens equal eager's.
"""

import json

import numpy as np
import pytest
import torch
from conftest import llmc_in_process

import llmc
from llmc.compiler import diff_metrics, llm, targets, ukernels
from llmc.errors import UsageError
from llmc.models.llama.config import get_config
from llmc.models.llama.model import LlamaDecode, LlamaPrefill, LlamaPrefillChunk, init_random, new_cache
from llmc.tools.make_checkpoint import write_checkpoint

MAX_SEQ = 48
CHUNK = 8
ARCH = "x86-64-v3"  # AVX2: llmc's C kernels serve on any x86-64 CPU this runs on


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    config = get_config("tiny")
    write_checkpoint(config, "hf", root / "hf", dtype="f32", seed=3)
    art = llmc.compile(root / "hf", output=root / "k.vmfb", max_seq_len=MAX_SEQ, prefill_chunk=CHUNK, arch=ARCH, kv_dtype="bf16")
    llama = llm.load_llama(root / "hf").eval()
    llama.set_rope_positions(MAX_SEQ)
    return root, config, llama, llmc.load(art)


def _prompt(n, vocab, seed=0):
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(300 + n + seed))


def test_eager_bf16_cache_stores_rounded_rows_and_changes_the_logits():
    """The model itself: a bf16 cache holds the f32 cache's rows rounded to bf16, and attention over them
    gives logits near, but not equal to, the f32 cache's."""
    config = get_config("tiny")
    model = init_random(config, seed=1, rope_positions=32)
    ids = torch.randint(0, config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        f32 = LlamaPrefill(model)(ids, *new_cache(config, 32))
        b16 = LlamaPrefill(model)(ids, *new_cache(config, 32, torch.bfloat16))
        assert all(b.dtype == torch.bfloat16 and torch.equal(b, f.bfloat16()) for f, b in zip(f32[1:], b16[1:]))
        torch.testing.assert_close(b16[0], f32[0], rtol=0, atol=0)  # the prefill attends over its own f32 rows
        tok, mask = torch.tensor([[5]]), torch.ones(1, 8, dtype=torch.int64)
        d32 = LlamaDecode(model)(tok, mask, *f32[1:])
        d16 = LlamaDecode(model)(tok, mask, *b16[1:])
    diff = float((d16[0] - d32[0]).abs().max())
    assert 0 < diff < 0.05 * float(d32[0].abs().max()), diff


def test_manifest_and_the_kernel(setup):
    root, config, _, mod = setup
    cache = mod.manifest["llm"]["cache"]
    assert cache["dtype"] == "bfloat16" and cache["narrowed"] is True
    assert mod.manifest["compute_dtype"] == "f32"
    for name in ("prefill", "decode", "prefill_chunk"):
        args = mod.manifest["entry_points"][name]["inputs"][mod.manifest["llm"][name]["cache_args_start"]:]
        assert [a["dtype"] for a in args] == ["bfloat16"] * 2 * config.n_layers, (name, args)
    stats = {p["name"]: p for p in mod.manifest["passes"]}
    if ukernels.unavailable(targets.resolve("cpu", ARCH, "f32")) is not None:
        pytest.skip("llmc's cpu kernels do not serve this machine")
    # the decode entry's attention in every layer, and the chunk's last layer, where its last position attends alone
    assert stats["decode-attention-kernel"]["rewrote"] == config.n_layers + 1
    info = llmc_in_process("info", root / "k.vmfb")
    assert "x bfloat16[1, " in info.stdout, info.stdout


MAX_REL = diff_metrics.TOLERANCES["kv-bf16"]["max_rel"]


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _same_but_boundary_rounding(got, want, rows):
    """Two bf16 caches equal in their first `rows` rows but for a few elements one bf16 step apart."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.bfloat16
        steps = (g[:, :, :rows].view(torch.int16).int() - w[:, :, :rows].view(torch.int16).int()).abs()
        assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) <= 0.01, (int(steps.max()), float((steps > 0).float().mean()))


def test_prefill_decode_and_chunk_match_eager_with_a_bf16_cache(setup):
    _, config, llama, mod = setup
    ids = _prompt(9, config.vocab_size)
    zeros = lambda: [torch.zeros(1, config.n_kv_heads, MAX_SEQ, config.head_dim, dtype=torch.bfloat16) for _ in range(2 * config.n_layers)]
    with torch.no_grad():
        ref = LlamaPrefill(llama)(ids, *new_cache(config, MAX_SEQ, torch.bfloat16))
        ref32 = LlamaPrefill(llama)(ids, *new_cache(config, MAX_SEQ))
    got = mod.prefill(ids, *zeros())
    assert _rel(got[0], ref[0]) <= 1e-5  # the prefill attends over its own f32 rows: the f32 profile
    n, to_bf16, to_f32 = ids.shape[1], [], []
    rc, gc, rc32 = ref[1:], got[1:], ref32[1:]
    for _ in range(5):
        tok = int(ref[0][0, -1].argmax())
        n += 1
        token, mask = torch.tensor([[tok]]), torch.ones(1, n, dtype=torch.int64)
        with torch.no_grad():
            ref, ref32 = LlamaDecode(llama)(token, mask, *rc), LlamaDecode(llama)(token, mask, *rc32)
        got = mod.decode(token, mask, *gc)
        to_bf16.append(_rel(got[0], ref[0]))
        to_f32.append(_rel(got[0], ref32[0]))
        rc, gc, rc32 = ref[1:], got[1:], ref32[1:]
    assert max(to_bf16) <= MAX_REL, to_bf16
    assert sum(to_bf16) < sum(to_f32) / 2, (to_bf16, to_f32)  # nearer the bf16 cache's eager than the f32 cache's
    _same_but_boundary_rounding(gc, rc, n)
    # the chunk: 8 tokens after the 14 cached ones, against eager's chunk over the same bf16 cache
    chunk = _prompt(CHUNK, config.vocab_size, seed=1)
    mask = torch.ones(1, n + CHUNK, dtype=torch.int64)
    with torch.no_grad():
        want = LlamaPrefillChunk(llama)(chunk, mask, *rc)
    got = mod.prefill_chunk(chunk, mask, *gc)
    assert _rel(got[0], want[0]) <= MAX_REL
    _same_but_boundary_rounding(got[1:], want[1:], n + CHUNK)


def test_generate_matches_eager_greedy_with_a_bf16_cache(setup):
    _, config, llama, mod = setup
    ids = _prompt(19, config.vocab_size)  # a decode-step prefill of 3, then two chunks
    want, cache = [], new_cache(config, MAX_SEQ, torch.bfloat16)
    with torch.no_grad():
        out = LlamaPrefill(llama)(ids, *cache)
        n = ids.shape[1]
        for _ in range(12):
            want.append(int(out[0][0, -1].argmax()))
            n += 1
            out = LlamaDecode(llama)(torch.tensor([[want[-1]]]), torch.ones(1, n, dtype=torch.int64), *out[1:])
    assert len(set(want)) > 3, "degenerate reference: pick another seed"
    assert mod.generate(ids[0].tolist(), 12, stop_at_eos=False) == want
    assert mod.last_generation.prefill_function == "prefill_chunk"


def test_llmc_diff_compares_against_eager_with_the_same_cache(setup, tmp_path):
    root, *_ = setup
    r = llmc_in_process("diff", root / "hf", root / "k.vmfb", "--seq", "12", "--steps", "3", "--json", tmp_path / "d.json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.dumps(json.loads((tmp_path / "d.json").read_text()))
    assert "decode[2].logits" in report and "prefill_chunk.logits" in report
    assert "\"profile\": \"kv-bf16\"" in report  # f32 math over a bf16 cache: compiler/diff_metrics.py profile_for


@pytest.mark.parametrize("spec, target, dtype, tp, needle", [
    ("f16", "cpu", "f32", 1, "--kv-dtype=f16: give auto, f32, bf16"),
    ("bf16", "vulkan", "f32", 1, "cpu only for now"),
    ("f32", "cuda", "f16", 1, "cpu only for now"),
    ("bf16", "cpu", "f32", 2, "not available with --tensor-parallel"),
    ("bf16", "cpu", "f16", 1, "--kv-dtype bf16: cpu stores a f16 model's cache as f16 or, under f32 math, bf16; give auto or bf16"),
])
def test_bad_kv_dtypes_are_refused(spec, target, dtype, tp, needle):
    with pytest.raises(UsageError) as e:
        llm.resolve_kv_dtype(spec, targets.resolve(target, None, dtype), tp)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_auto_is_bf16_for_bf16_weights_on_cpu_else_the_compute_dtype():
    for name, dtype, want in (("cpu", "f32", "f32"), ("cpu", "fp8", "f32"), ("cpu", "int8", "f32"), ("cuda", "f16", "f16"),
                              ("cuda", "bf16", "bf16"), ("vulkan", "bf16", "f32")):
        target = targets.resolve(name, None, dtype)
        assert llm.resolve_kv_dtype("auto", target, 1) == want == target.compute_dtype
    cpu_bf16 = targets.resolve("cpu", None, "bf16")
    assert cpu_bf16.compute_dtype == "f32" and llm.resolve_kv_dtype("auto", cpu_bf16, 1) == "bf16"
    assert llm.resolve_kv_dtype("auto", cpu_bf16, 2) == "f32"  # --tensor-parallel: not yet
    assert llm.resolve_kv_dtype("f32", cpu_bf16, 1) == "f32"  # the old cache, asked for
    assert llm.resolve_kv_dtype("bf16", targets.resolve("cpu", None, "fp8"), 1) == "bf16"


def test_cli_refuses_a_bad_kv_dtype_in_one_line(setup, tmp_path):
    root, *_ = setup
    r = llmc_in_process("compile", root / "hf", "--kv-dtype", "int4", "-o", tmp_path / "x.vmfb")
    assert r.returncode == 2 and "--kv-dtype=int4" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = llmc_in_process("compile", root / "hf", "--target", "vulkan", "--kv-dtype", "bf16", "-o", tmp_path / "v.vmfb")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--kv-dtype bf16" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_kv_dtype_is_refused_for_a_program_that_is_not_a_llama(tmp_path):
    """An nn.Module with example inputs has no KV cache: one-line UsageError (exit 2), nothing written."""
    with pytest.raises(UsageError) as e:
        llmc.compile(torch.nn.Linear(4, 4), (torch.randn(1, 4),), output=tmp_path / "m.vmfb", kv_dtype="bf16")
    assert str(e.value) == "--kv-dtype applies to Llama checkpoints; Linear is not one" and e.value.exit_code == 2
    assert not list(tmp_path.iterdir())
