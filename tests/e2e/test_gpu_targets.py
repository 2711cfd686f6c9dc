"""GPU targets end to end: the tiny Llama checkpoint compiled for hip, cuda, xpu and vulkan.

- Compile-only cells (DEFAULT_CELLS in the default run; the whole target x arch x dtype matrix under
  -m slow) read the executables inside the
  .vmfb: their format, and the architecture the binary itself names (AMDGPU code object, PTX) or the
  module's own device target (SPIR-V). A build that silently fell back to the CPU or to another arch
  fails here.
- vulkan RUNS on Mesa's lavapipe (CI installs mesa-vulkan-drivers; set LLMC_REQUIRE_VULKAN=1 to turn
  a missing driver into a failure instead of a skip): 16 greedy tokens equal to transformers'
  LlamaForCausalLM in f32 on the same checkpoint, and `llmc diff` passes in f32, f16 and bf16 (from a
  bf16 checkpoint: SPIR-V converts its weights, compiler/llm.py _kept_narrow) against eager PyTorch
  with the dtype's tolerance profile (compiler/diff_metrics.py). The modules they run are read like
  the compile-only cells first.
- The runtime refuses what it cannot run right: a module whose subgroup size the device lacks, a
  module for a driver this machine does not have, a module on another driver's device.

One compile per (checkpoint, target, arch, dtype) in this module (the `build` fixture): a module built
for a compile-only cell also serves the refusal tests, and the CLI runs in this process
(conftest.llmc_in_process) where the test is about what llmc says, not about the interpreter.
"""

import functools
import json
import math

import pytest
import torch

import llmc
from llmc.compiler import targets, vmfb
from llmc.errors import RuntimeLoadError
from llmc.models.llama.config import get_config
from llmc.tools.make_checkpoint import write_checkpoint

from conftest import llmc_in_process, vulkan_or_skip

MAX_SEQ = 64
PROMPT = [1, 77, 30, 5, 42, 9, 200, 13]
FORMAT = {"hip": "rocm-hsaco-fb", "cuda": "cuda-nvptx-fb", "xpu": "vulkan-spirv-fb", "vulkan": "vulkan-spirv-fb"}

# Default run (the checkpoint route: prefill + decode with a KV cache): each fp8 decode flavour (FNUZ on
# gfx942, FN on gfx1201, software on sm_90), gfx950 with its route around IREE's small-M matmul crash,
# the archs llmc writes into the module (sm_90, xe2: xpu's archs share one route, _module_target, and
# arc's attribute is unit-tested) and int8 on a GPU. The same checks run on every vulkan module the
# tests below build: llvmpipe in f32, f16 and bf16 (f16 on SPIR-V, the half-matmul attention form) and
# an NVIDIA IREE Vulkan name (ampere, in test_runtime_refuses_a_module_built_for_another_subgroup_size).
# Every dtype on every target is covered in the default run by the op matrix
# (tests/e2e/test_dtype_matrix.py) and by the vulkan runs below; the whole target x arch x dtype matrix
# of this file (90 cells) runs with -m slow; the arch names themselves are unit-tested in
# tests/compiler/test_targets.py.
DEFAULT_CELLS = [
    ("hip", "gfx942", "fp8"), ("hip", "gfx950", "f16"), ("hip", "gfx1201", "fp8"),
    ("cuda", "sm_90", "fp8"), ("xpu", "xe2", "bf16"), ("cuda", "sm_90", "int8"),
]
ALL_CELLS = [
    (t, a, d)
    for t in ("hip", "cuda", "xpu", "vulkan")
    for a in targets.TARGETS[t].archs
    for d in ("f32", "f16", "bf16", "fp8", "int8")
]


def _write_tiny(tmp_path_factory, dtype: str):
    """The tiny Llama's HF checkpoint in `dtype` (seed 3): (its folder, its config)."""
    root = tmp_path_factory.mktemp(f"gpu_{dtype}")
    config = get_config("tiny")
    write_checkpoint(config, "hf", root / "hf", dtype=dtype, seed=3)
    return root / "hf", config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _write_tiny(tmp_path_factory, "f32")


def _irpa_sizes(path) -> dict[str, int]:
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(path))
    return {k: e.length for k, e in index.items()}


def _checkpoint_numels(folder) -> dict[str, int]:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                out[k] = math.prod(st.get_slice(k).get_shape())
    return out


def linear_names(checkpoint) -> set[str]:
    return {k for k in _checkpoint_numels(checkpoint[0]) if k.endswith("proj.weight") or k == "lm_head.weight"}


@pytest.fixture(scope="module")
def checkpoint_bf16(tmp_path_factory):
    return _write_tiny(tmp_path_factory, "bf16")


def _compile(checkpoint, tmp_path, target, arch, dtype):
    path, _ = checkpoint
    out = tmp_path / f"{target}-{arch}-{dtype}.vmfb"
    return llmc.compile(path, target=target, arch=arch, dtype=dtype, output=out, max_seq_len=MAX_SEQ)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(checkpoint, target, arch, dtype): compiled once per module, whichever test asks first."""

    @functools.cache  # checkpoint: (folder, config), both hashable
    def get(checkpoint, target, arch, dtype):
        return _compile(checkpoint, tmp_path_factory.mktemp("build"), target, arch, dtype)

    return get


def _check_cell(checkpoint, tmp_path, target, arch, dtype, art=None):
    art = art or _compile(checkpoint, tmp_path, target, arch, dtype)
    manifest = art.read_manifest()
    info = vmfb.inspect(art.vmfb)
    assert info.formats == {FORMAT[target]}, info.summary()  # no CPU (embedded-elf) fallback
    assert all(e.valid for e in info.executables)
    caps = targets.TARGETS[target].archs[arch]
    # IREE names its NVIDIA-type Vulkan targets by the SM they stand for.
    want_arch = {"xpu": f"intel-{arch}", "vulkan": {"ampere": "sm_80", "ada": "sm_89", "pascal": "sm_60"}.get(arch, arch)}.get(target, arch)
    assert info.target_archs == {want_arch}, info.summary()
    if target in ("hip", "cuda"):
        assert info.binary_archs == {arch}, info.summary()  # the code objects / PTX name the arch themselves
    assert set(info.subgroup_sizes) == set(caps.subgroup_sizes)
    t = manifest["target"]
    assert (t["name"], t["arch"], manifest["dtype"]) == (target, arch, dtype)
    assert t["requires"]["subgroup_sizes"] == list(caps.subgroup_sizes)
    assert t["requires"]["float16"] == (dtype in ("f16", "fp8", "int8"))  # fp8/int8 weights compute in f16 on GPUs
    ran = {p["name"]: p for p in manifest["passes"]}
    skipped = {p["name"] for p in manifest["passes_skipped"]}
    if target in ("hip", "cuda"):
        assert "decompose-attention" in skipped  # SDPA reaches IREE whole: its fused attention op
    else:
        assert ran["decompose-attention"]["rewrote"] == 4  # 2 layers x (prefill, decode)
        if dtype in ("f16", "fp8", "int8"):  # fp8/int8 weights compute in f16 on GPUs
            assert ran["decompose-attention"]["forms"] == {"half-matmul": 4}
    if dtype == "fp8":  # native E4M3 where IREE lowers it for the arch, else the integer decode
        decode = {"gfx942": "e4m3fnuz", "gfx950": "e4m3fn", "gfx1201": "e4m3fn"}.get(arch, "software")
        assert ran["fp8-weights"]["forms"] == {f"per-channel {decode}": 2 * len(linear_names(checkpoint))}  # prefill + decode
        assert manifest["compute_dtype"] == "f16"
    if dtype == "int8":  # the int8 codes reach the matmul dispatches as i8: no dispatch converts them on its own
        # Every linear and the embedding table (int8's default), in prefill and in decode.
        assert ran["int8-weights"]["forms"] == {"per-channel int8": 2 * (len(linear_names(checkpoint)) + 1)}
        assert manifest["compute_dtype"] == "f16"
        converts = [d for d in info.dispatches if "i8x" in d or d.startswith("_initializer")]
        assert not converts and any("matmul" in d for d in info.dispatches), info.dispatches
    return art, manifest


@pytest.mark.parametrize("target,arch,dtype", DEFAULT_CELLS, ids=["-".join(c) for c in DEFAULT_CELLS])
def test_compiles_for_gpu_arch(checkpoint, build, target, arch, dtype):
    _check_built(checkpoint, build(checkpoint, target, arch, dtype), target, arch, dtype)


def _check_built(checkpoint, art, target, arch, dtype):
    """_check_cell, then the parameters' storage, the cache dtype and the logits' dtype."""
    art, manifest = _check_cell(checkpoint, None, target, arch, dtype, art=art)
    sizes = _irpa_sizes(art.params)
    shapes = _checkpoint_numels(checkpoint[0])
    width = {"f32": 4, "f16": 2, "bf16": 2, "fp8": 2, "int8": 2}[dtype]  # bf16 on SPIR-V too: stored as 16-bit words
    linear = {k for k in shapes if k.endswith("proj.weight") or k == "lm_head.weight"}
    one_byte = {"fp8": linear, "int8": linear | {"model.embed_tokens.weight"}}.get(dtype, set())  # int8: the table too
    assert {k: sizes[k] for k in shapes} == {k: n * (1 if k in one_byte else width) for k, n in shapes.items()}
    cache_dtype = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "fp8": "float16", "int8": "float16"}[dtype]
    if dtype == "bf16" and target in ("xpu", "vulkan"):
        cache_dtype = "float32"
    assert manifest["llm"]["cache"]["dtype"] == cache_dtype  # SPIR-V bf16 computes in f32
    if dtype == "bf16" and target in ("xpu", "vulkan"):
        assert manifest["compute_dtype"] == "f32"
    # logits leave every entry point in f32 whatever the compute dtype (models/llama/model.py head_logits)
    logits = {name: ep["outputs"]["children"][0] for name, ep in manifest["entry_points"].items()}
    assert all(o["role"] == "logits" for o in logits.values())
    assert {name: o["dtype"] for name, o in logits.items()} == dict.fromkeys(logits, "float32")


@pytest.mark.slow
@pytest.mark.parametrize("target,arch,dtype", ALL_CELLS, ids=["-".join(c) for c in ALL_CELLS])
def test_compiles_for_every_gpu_cell(checkpoint, tmp_path, target, arch, dtype):
    _check_cell(checkpoint, tmp_path, target, arch, dtype)


# ---------------------------------------------------------------------------------------------
# vulkan on lavapipe: run, compare, refuse


@pytest.fixture(scope="module")
def vulkan_f32(checkpoint, build):
    vulkan_or_skip(lock=False)  # compiles first: exclusive from the first Vulkan device it opens (conftest)
    return build(checkpoint, "vulkan", None, "f32")


def test_vulkan_greedy_16_tokens_equal_transformers_f32(checkpoint, vulkan_f32):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(checkpoint[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    want = out[0, len(PROMPT):].tolist()
    r = llmc_in_process("run", vulkan_f32.vmfb, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 16, "--no-eos", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == want
    assert vmfb.inspect(vulkan_f32.vmfb).formats == {"vulkan-spirv-fb"}  # it ran SPIR-V, not a CPU fallback


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_vulkan_llmc_diff_passes(checkpoint, checkpoint_bf16, build, vulkan_f32, tmp_path, dtype):
    """bf16 from a bf16 checkpoint: SPIR-V converts its weights (compiler/llm.py _kept_narrow); kept
    bf16 there, iree-compile failed ("'tensor.cast' op operand type 'tensor<64x64xf32>' and result type
    'tensor<64x64xbf16>' are cast incompatible")."""
    ckpt = checkpoint_bf16 if dtype == "bf16" else checkpoint
    art = build(ckpt, "vulkan", None, dtype)
    # Read like a compile-only cell (llvmpipe is the default arch): f16 on SPIR-V, bf16's f32 cache.
    _check_built(ckpt, art, "vulkan", "llvmpipe", dtype)
    report = tmp_path / "diff.json"
    r = llmc_in_process("diff", ckpt[0], art.vmfb, "--json", report)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(report.read_text())
    assert data["passed"] and data["profile"] == dtype and data["target"] == "vulkan"
    assert "greedy tokens: 8 of 8 decode-step inputs agree" in r.stdout


@pytest.mark.vulkan  # loads its module on lavapipe
def test_runtime_refuses_a_module_built_for_another_subgroup_size(checkpoint, build):
    """ampere is subgroup 32, lavapipe 8: IREE would run it with no error and wrong results. The same
    module is read like a compile-only cell first: IREE names its NVIDIA-type Vulkan targets by the SM
    they stand for (sm_80)."""
    vulkan_or_skip(lock=False)  # compiles first: exclusive from the first Vulkan device it opens (conftest)
    art = build(checkpoint, "vulkan", "ampere", "f32")
    _check_built(checkpoint, art, "vulkan", "ampere", "f32")
    with pytest.raises(RuntimeLoadError, match="subgroup size 32.*has subgroup size 8, and IREE would run the module with wrong results"):
        llmc.load(art).generate(PROMPT, 2)
    r = llmc_in_process("run", art.vmfb, "--prompt-ids", "1,2,3", "--max-new-tokens", 2)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "subgroup size 32" in r.stderr


@pytest.mark.vulkan  # loads its module on lavapipe
def test_runtime_refuses_other_drivers_and_missing_devices(checkpoint, build, vulkan_f32):
    with pytest.raises(RuntimeLoadError, match="runs on IREE's vulkan driver, not 'local-task'; use --device=vulkan"):
        llmc.load(vulkan_f32, device="local-task").generate(PROMPT, 2)
    with pytest.raises(RuntimeLoadError, match=r"--device=vulkan://GPU-none: no such vulkan device; here: vulkan://0 \(llvmpipe"):
        llmc.load(vulkan_f32, device="vulkan://GPU-none").generate(PROMPT, 2)
    with pytest.raises(RuntimeLoadError, match=r"--device=vulkan://7: this machine has 1 vulkan device\(s\)"):
        llmc.load(vulkan_f32, device="vulkan://7").generate(PROMPT, 2)
    assert llmc.load(vulkan_f32, device="vulkan://0").generate(PROMPT, 4, stop_at_eos=False) == llmc.load(vulkan_f32).generate(PROMPT, 4, stop_at_eos=False)
    hip = build(checkpoint, "hip", "gfx942", "fp8")  # test_compiles_for_gpu_arch[hip-gfx942-fp8]'s module
    r = llmc_in_process("run", hip.vmfb, "--prompt-ids", "1,2,3", "--max-new-tokens", 2)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "compiled for hip:gfx942; no hip device here (usable here: " in r.stderr and "vulkan" in r.stderr
