"""`--dtype int8` (weight-only, per-channel) end to end on the tiny Llama (HF checkpoint, f32 random
weights, seed 3: the checkpoint tests/e2e/test_fp8.py uses).

- cpu, with the embedding table in int8 too (the int8 default): the first 8 greedy tokens equal
  eager f32's (transformers' LlamaForCausalLM with the original weights), the .irpa is at most 0.35x
  the f32 weights' bytes (what an f32 build's .irpa holds at least), every quantized weight is 1 byte per element plus one f32 scale per row, and
  `llmc diff` passes both references (eager f32 with the original weights under the int8 profile;
  eager f32 with the same int8 weights under the f32 profile). The same build carries
  tests/e2e/test_narrow_decode.py's checks: a decode step reads the packed weights in llmc's C
  kernels, and its 16-token prefill bucket computes what the dynamic prefill does.
- cpu through the CLI with `--quant-exclude 'lm_head.*' --no-quant-embeddings`: the output head and
  the embedding table stay f32 and 8 tokens equal eager f32 with the same weights.
- vulkan (lavapipe, f16 math; slow): the module decodes the same 8 tokens and `llmc diff` passes.
GPU compile-only cells (hip, cuda: the codes reach the matmul dispatches as i8) are in
tests/e2e/test_gpu_targets.py and tests/e2e/test_dtype_matrix.py.
"""

import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import llmc_in_process
from narrow_checks import check_bucket_matches_dynamic_prefill, check_kernel_reads, narrow_build_options

import llmc
from llmc.models.llama.config import get_config
from llmc.passes.int8_weights import INT8
from llmc.passes._packed import KERNEL_GROUPS, PACK
from llmc.passes._quantized_weights import dequantized
from llmc.tools.make_checkpoint import write_checkpoint

MAX_SEQ = 64
PROMPT = [1, 77, 30, 5, 42, 9, 200, 13]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    write_checkpoint(get_config("tiny"), "hf", root / "hf", dtype="f32", seed=3)
    return root


@pytest.fixture(scope="module")
def cpu_int8(checkpoint):
    # with a 16-token bucket and IR dumps: the build also serves tests/e2e/test_narrow_decode.py's checks
    # (PROMPT's 8 tokens and `llmc diff`'s 17 fit no bucket: the tests below run the dynamic prefill)
    return llmc.compile(checkpoint / "hf", dtype="int8", output=checkpoint / "int8.vmfb", max_seq_len=MAX_SEQ,
                        **narrow_build_options(checkpoint))


@pytest.fixture(scope="module")
def eager_tokens(checkpoint):
    """8 greedy tokens of transformers' LlamaForCausalLM in f32 with the checkpoint's own weights."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(checkpoint / "hf", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def _llmc(*args):
    return subprocess.run([sys.executable, "-m", "llmc.compiler.cli", *map(str, args)], capture_output=True, text=True, timeout=600)


def _irpa_sizes(path) -> dict[str, int]:
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(path))
    return {k: e.length for k, e in index.items()}


def _shapes(folder) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as st:
        return {k: st.get_slice(k).get_shape() for k in st.keys()}


def test_cpu_int8_greedy_tokens_equal_eager_f32_and_irpa_is_a_third_of_f32(checkpoint, cpu_int8, eager_tokens):
    stats = next(p for p in cpu_int8.read_manifest()["passes"] if p["name"] == "int8-weights")
    n_layers = get_config("tiny").n_layers
    # 7 linears per layer, the head and the embedding table, in prefill, its 16-token bucket and decode
    # (each stored once).
    assert stats["declined"] == 0 and stats["rewrote"] == 3 * (7 * n_layers + 2), stats
    assert llmc.load(cpu_int8).generate(PROMPT, 8, stop_at_eos=False) == eager_tokens
    # An f32 build's .irpa holds every checkpoint tensor in f32: at least 4 bytes per element (the
    # checkpoint is f32, so that is its tensors' bytes). Against that floor the bound is no looser
    # than against the f32 build itself, without compiling one.
    f32_bytes = 4 * sum(math.prod(shape) for shape in _shapes(checkpoint / "hf").values())
    ratio = cpu_int8.params.stat().st_size / f32_bytes
    assert ratio <= 0.35, ratio


def test_cpu_int8_weights_are_one_byte_and_diff_passes(checkpoint, cpu_int8):
    sizes = _irpa_sizes(cpu_int8.params)
    shapes = _shapes(checkpoint / "hf")
    two_d = {k for k, shape in shapes.items() if len(shape) == 2}
    # 1 byte per weight, rows padded to the packed cpu layout's group: 32 where the C kernels compute the
    # products (the build's stats say so), else 8 (the tiny model's rows are multiples of 8, its ffn's 176 not of 32)
    stats = next(p for p in cpu_int8.read_manifest()["passes"] if p["name"] == "int8-weights")
    g = KERNEL_GROUPS["int8"] if any("C kernel calls" in form for form in stats["forms"]) else PACK
    assert {k: sizes[k] for k in two_d} == {k: -(-shapes[k][0] // g) * g * shapes[k][1] for k in two_d}
    assert {k: sizes[f"{k}_int8_scale"] for k in two_d} == {k: 4 * shapes[k][0] for k in two_d}  # one f32 scale per row
    manifest = cpu_int8.read_manifest()
    assert manifest["dtype"] == "int8" and manifest["compute_dtype"] == "f32"
    # fixed_row_products: the build has a prefill bucket (compiler/llm.py)
    assert manifest["target"]["pass_options"] == {"quant_exclude": [], "quant_embeddings": True, "fixed_row_products": True}
    r = llmc_in_process("diff", checkpoint / "hf", cpu_int8.vmfb, "--json", checkpoint / "diff.json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((checkpoint / "diff.json").read_text())
    assert report["passed"] and report["profile"] == "int8"
    vs_f32, vs_same = report["entry_points"]
    assert vs_same["name"] == "prefill+decode vs same int8 weights" and vs_same["passed"]
    assert report["same_weights"]["profile"] == "f32" and report["same_weights"]["weights"] == len(two_d)
    same = [o["cosine"] for o in vs_same["outputs"]]
    assert min(o["cosine"] for o in vs_f32["outputs"]) >= 0.999 and min(same) >= 0.99999
    assert "and vs the same int8 weights" in r.stdout


def test_cli_quant_exclude_keeps_the_output_head_in_float(checkpoint, tmp_path):
    """`--dtype int8 --quant-exclude 'lm_head.*' --no-quant-embeddings`: the head (the .irpa's name,
    not the export wrapper's) and the embedding table stay f32; 8 greedy tokens equal transformers
    with the other linears dequantized."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "int8-head.vmfb"
    r = llmc_in_process("compile", checkpoint / "hf", "--dtype", "int8", "--quant-exclude", "lm_head.*", "--no-quant-embeddings",
              "--max-seq-len", MAX_SEQ, "-o", out)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads(out.with_suffix(".json").read_text())
    stats = next(p for p in manifest["passes"] if p["name"] == "int8-weights")
    assert sorted(stats["decline_reasons"]) == ["embedding table (set quant_embeddings to quantize it)", "excluded by 'lm_head.*'"]
    assert manifest["target"]["pass_options"] == {"quant_exclude": ["lm_head.*"], "quant_embeddings": False}
    sizes = _irpa_sizes(out.with_suffix(".irpa"))
    shapes = _shapes(checkpoint / "hf")
    assert "model.embed_tokens.weight_int8_scale" not in sizes
    assert "lm_head.weight_int8_scale" not in sizes and sizes["lm_head.weight"] == 4 * math.prod(shapes["lm_head.weight"])
    hf = transformers.LlamaForCausalLM.from_pretrained(checkpoint / "hf", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2 and not name.startswith(("lm_head", "model.embed_tokens")):
                p.copy_(dequantized(INT8, p))
        want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert llmc.load(out).generate(PROMPT, 8, stop_at_eos=False) == want[0, len(PROMPT):].tolist()


def test_cpu_int8_decode_reads_the_packed_weights_in_the_kernels(checkpoint, cpu_int8):
    """tests/e2e/test_narrow_decode.py's check with the C kernels: each packed int8 weight of a decode
    step is read by llmc's matvec kernel, no widened copy written."""
    check_kernel_reads(checkpoint, "int8", get_config("tiny").n_layers)


def test_cpu_int8_bucket_matches_its_dynamic_prefill(cpu_int8):
    check_bucket_matches_dynamic_prefill(llmc.load(cpu_int8), get_config("tiny").vocab_size)


@pytest.mark.parametrize("flag", ["--no-quant-embeddings", "--quant-embeddings"])
def test_embedding_flags_refused_without_a_quantized_dtype(checkpoint, tmp_path, flag):
    r = llmc_in_process("compile", checkpoint / "hf", "--dtype", "bf16", flag, "-o", tmp_path / "x.vmfb")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--[no-]quant-embeddings" in r.stderr and "only (compiling bf16)" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


# Slow (48 s in CI): tests/e2e/test_dtype_matrix.py's vulkan-int8 cell runs int8 linears and an int8
# embedding table on lavapipe against eager with the same weights in 13 s; this adds the Llama tokens.
@pytest.mark.slow
def test_vulkan_int8_decodes_the_same_tokens_and_diff_passes(checkpoint, tmp_path, eager_tokens):
    from conftest import vulkan_or_skip

    vulkan_or_skip()
    art = llmc.compile(checkpoint / "hf", target="vulkan", dtype="int8", output=tmp_path / "vk.vmfb", max_seq_len=MAX_SEQ)
    assert art.read_manifest()["compute_dtype"] == "f16"
    assert llmc.load(art).generate(PROMPT, 8, stop_at_eos=False) == eager_tokens
    r = _llmc("diff", checkpoint / "hf", art.vmfb)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "tolerance profile int8" in r.stdout and "same int8 weights" in r.stdout
