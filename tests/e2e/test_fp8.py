"""`--dtype fp8` end to end on the tiny Llama (HF checkpoint, f32 random weights, seed 3).

- cpu: 16 greedy tokens equal transformers' LlamaForCausalLM run in f32 with the same quantized
  weights (each linear weight replaced by decode(q) * s in PyTorch, passes/fp8_weights.py), and
  `llmc diff` passes both of its references: eager f32 with the original weights under the fp8
  profile (logits cosine >= 0.99, compiler/diff_metrics.py), and eager f32 with the same fp8 weights
  under the f32 profile (cosine >= 0.99999, max_rel <= 1e-5). Every quantized weight is 1 byte per element in the .irpa.
  The same build carries tests/e2e/test_narrow_decode.py's checks: a decode step reads the packed
  weights in llmc's C kernels, and its 16-token prefill bucket computes what the dynamic prefill does.
- vulkan (lavapipe): the same diff passes (software decode, f16 math).
"""

import json
import subprocess
import sys

import pytest
import torch
from conftest import llmc_in_process
from narrow_checks import check_bucket_matches_dynamic_prefill, check_kernel_reads, narrow_build_options

import llmc
from llmc.models.llama.config import get_config
from llmc.passes.fp8_weights import decode_sw, quantize
from llmc.tools.make_checkpoint import write_checkpoint

MAX_SEQ = 64
PROMPT = [1, 77, 30, 5, 42, 9, 200, 13]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    write_checkpoint(get_config("tiny"), "hf", root / "hf", dtype="f32", seed=3)
    return root


@pytest.fixture(scope="module")
def cpu_fp8(checkpoint):
    # with a 16-token bucket and IR dumps: the build also serves tests/e2e/test_narrow_decode.py's checks
    # (PROMPT's 8 tokens and `llmc diff`'s 17 fit no bucket: the tests below run the dynamic prefill)
    return llmc.compile(checkpoint / "hf", dtype="fp8", output=checkpoint / "fp8.vmfb", max_seq_len=MAX_SEQ, fp8_embeddings=True,
                        **narrow_build_options(checkpoint))


def _llmc(*args):
    return subprocess.run([sys.executable, "-m", "llmc.compiler.cli", *map(str, args)], capture_output=True, text=True, timeout=600)


def _irpa_sizes(path) -> dict[str, int]:
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(path))
    return {k: e.length for k, e in index.items()}


def test_cpu_fp8_greedy_tokens_equal_eager_on_the_same_quantized_weights(checkpoint, cpu_fp8):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(checkpoint / "hf", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:  # every linear and the embedding (compiled with fp8_embeddings)
                bits, scale = quantize(p)
                p.copy_(decode_sw(bits) * scale)
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    want = out[0, len(PROMPT):].tolist()
    got = llmc.load(cpu_fp8).generate(PROMPT, 16, stop_at_eos=False)
    assert got == want


def test_cpu_fp8_tied_embeddings_greedy_tokens_equal_eager_on_the_same_quantized_weights(tmp_path):
    """tiny-llama3 ties its embedding table to the output head: the table is quantized because the
    head multiplies by it (no fp8_embeddings needed), stored packed, and the embedding gathers its
    rows' codes from the packed layout. The checkpoint is bf16: the other linear weights stay bf16
    through export and are quantized from their own values (export.convert_module)."""
    transformers = pytest.importorskip("transformers")
    cfg = get_config("tiny-llama3")
    write_checkpoint(cfg, "hf", tmp_path / "hf", dtype="bf16", seed=3)
    art = llmc.compile(tmp_path / "hf", dtype="fp8", output=tmp_path / "fp8.vmfb", max_seq_len=MAX_SEQ)
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "fp8-weights")
    # 7 linears per layer and the tied table, in prefill and in decode; all packed.
    assert stats["declined"] == 0 and stats["rewrote"] == 2 * (7 * cfg.n_layers + 1), stats
    assert all(form.startswith("per-channel software, packed") for form in stats["forms"]), stats
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                bits, scale = quantize(p)
                p.copy_(decode_sw(bits) * scale)
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert llmc.load(art).generate(PROMPT, 16, stop_at_eos=False) == out[0, len(PROMPT):].tolist()


def test_cpu_fp8_exclude_names_the_checkpoint_weight(tmp_path):
    """--fp8-exclude matches the names the user sees (the .irpa's, `lm_head.weight`), not the export
    wrapper's (`llama.lm_head.weight`); the excluded head stays bf16 (f32 math) next to fp8 layers of
    a bf16 checkpoint, and 8 greedy tokens equal transformers with the same weights."""
    transformers = pytest.importorskip("transformers")
    write_checkpoint(get_config("tiny"), "hf", tmp_path / "hf", dtype="bf16", seed=3)
    art = llmc.compile(tmp_path / "hf", dtype="fp8", output=tmp_path / "fp8.vmfb", max_seq_len=MAX_SEQ, fp8_exclude=["lm_head.*"])
    stats = next(p for p in art.read_manifest()["passes"] if p["name"] == "fp8-weights")
    assert "excluded by 'lm_head.*'" in stats["decline_reasons"], stats
    assert "lm_head.weight_fp8_scale" not in _irpa_sizes(art.params)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2 and not name.startswith(("lm_head", "model.embed_tokens")):
                bits, scale = quantize(p)
                p.copy_(decode_sw(bits) * scale)
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert llmc.load(art).generate(PROMPT, 8, stop_at_eos=False) == out[0, len(PROMPT):].tolist()


def test_cpu_fp8_weights_are_one_byte_and_diff_passes(checkpoint, cpu_fp8):
    from safetensors import safe_open

    sizes = _irpa_sizes(cpu_fp8.params)
    with safe_open(str(next((checkpoint / "hf").glob("*.safetensors"))), "pt") as st:
        shapes = {k: st.get_slice(k).get_shape() for k in st.keys()}
    two_d = {k for k, shape in shapes.items() if len(shape) == 2}
    # 1 byte per weight, rows padded with zero codes to the packed group's size: the C kernel's 32
    # channels where it serves this cpu (64, the pair layout, where the cpu has AVX512_BF16 and K is even),
    # else 8 (passes/_packed.py)
    from llmc.compiler import targets, ukernels
    from llmc.passes._packed import KERNEL_GROUPS, PACK, padded

    target = targets.resolve("cpu", None, "fp8")
    kernels, pairs = ukernels.unavailable(target) is None, ukernels.fp8_pairs(target.arch)

    def group(k):
        return PACK if not kernels else KERNEL_GROUPS["fp8dp"] if pairs and k % 2 == 0 else KERNEL_GROUPS["fp8"]

    assert {k: sizes[k] for k in two_d} == {k: padded(shapes[k][0], group(shapes[k][1])) * shapes[k][1] for k in two_d}
    assert {k: sizes[f"{k}_fp8_scale"] for k in two_d} == {k: 4 * shapes[k][0] for k in two_d}  # one f32 scale per row
    manifest = cpu_fp8.read_manifest()
    assert manifest["dtype"] == "fp8" and manifest["compute_dtype"] == "f32"
    r = llmc_in_process("diff", checkpoint / "hf", cpu_fp8.vmfb, "--json", checkpoint / "diff.json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((checkpoint / "diff.json").read_text())
    assert report["passed"] and report["profile"] == "fp8"
    vs_f32, vs_same = report["entry_points"]  # vs eager f32 with the original weights; vs the same fp8 weights
    assert vs_same["name"] == "prefill+decode vs same fp8 weights" and vs_same["passed"]
    assert report["same_weights"] == {"profile": "f32", "tolerance": report["same_weights"]["tolerance"], "weights": len(two_d)}
    cosines = [o["cosine"] for o in vs_f32["outputs"]]
    same = [o["cosine"] for o in vs_same["outputs"]]
    assert len(cosines) == len(same) == 9 and min(cosines) >= 0.99  # prefill + 8 decode steps
    # With the same weights only f32 arithmetic is left: far closer than to the original weights.
    assert min(same) >= 0.99999 and max(o["max_rel"] for o in vs_same["outputs"]) <= 1e-5
    assert max(1 - c for c in cosines) > 100 * max(1 - c for c in same)
    assert "and vs the same fp8 weights" in r.stdout


def test_cpu_fp8_decode_reads_the_packed_weights_in_the_kernels(checkpoint, cpu_fp8):
    """tests/e2e/test_narrow_decode.py's check with the C kernels: each packed fp8 weight of a decode
    step is read by llmc's matvec kernel, no widened copy written."""
    check_kernel_reads(checkpoint, "fp8", get_config("tiny").n_layers)


def test_cpu_fp8_bucket_matches_its_dynamic_prefill(cpu_fp8):
    check_bucket_matches_dynamic_prefill(llmc.load(cpu_fp8), get_config("tiny").vocab_size)


# Slow (52 s in CI): tests/e2e/test_dtype_matrix.py's vulkan-fp8 cell runs fp8 linears on lavapipe
# against eager with the same quantized weights in 17 s; this adds the whole-Llama llmc diff.
@pytest.mark.slow
def test_vulkan_fp8_diff_passes(checkpoint, tmp_path):
    from conftest import vulkan_or_skip

    vulkan_or_skip()
    art = llmc.compile(checkpoint / "hf", target="vulkan", dtype="fp8", output=tmp_path / "vk.vmfb", max_seq_len=MAX_SEQ)
    r = _llmc("diff", checkpoint / "hf", art.vmfb)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "tolerance profile fp8" in r.stdout
