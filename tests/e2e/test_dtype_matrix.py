"""The dtype matrix: {Linear+bias, MLP, RMSNorm, attention block, embedding, torch.dot}
x {f32, f16, bf16, fp8, int8} x {cpu, vulkan: run; hip gfx942/gfx950/gfx1100, xpu, cuda: compile}.

The matrix's last row, the tiny Llama decoder, is the checkpoint route (prefill + decode with a KV
cache) and has its own files: tests/e2e/test_gpu_targets.py (every target x arch x dtype compiles;
vulkan runs f32/f16/bf16 with `llmc diff`), tests/e2e/test_fp8.py (fp8 on cpu: 16 greedy tokens equal
eager on the same quantized weights, `llmc diff` vs f32; on vulkan: `llmc diff`) and
tests/e2e/test_llama_generate.py (cpu f32 and bf16).

One module holds every row (each row is its own output), so a (target, dtype) cell is one compile and
each row is checked on its own. The attention block is the `attn.transpose(1,2).flatten(2,3)` ->
linear pattern with grouped-query SDPA (the fp8 seed crash of the issue), the dot is spectral
normalization's `torch.dot(u, W v)`.

Runnable cells, against eager PyTorch on the same inputs (tolerances are the issue's table):
- f32: cosine >= 0.99999 and max|d| <= 1e-4 max|eager| per row, vs eager f32;
- f16 / bf16: cosine >= 0.999 per row vs eager in that dtype (bf16 on SPIR-V computes in f32, which
  is closer to eager f32 than eager bf16 is: it is held to the same bound vs eager bf16);
- fp8: cosine >= 0.995 per linear row vs eager f32 with the original weights, and cosine >= 0.9999 vs eager in the compute dtype with the same fp8 weights
  (each quantized weight replaced by decode(q) * s in PyTorch: what is left is arithmetic);
- int8 (weight-only, per-channel): the same two references, cosine >= 0.999 vs the original weights.
The spectral-norm sigma (a scalar) is checked as a relative error instead: 1e-5 (f32), 2e-3 (f16,
bf16's 8-bit mantissa: 1e-2), and under fp8 it goes through the quantized W: 2e-2.

Compile-only cells read the .vmfb: executables of the target's format only (no CPU fallback), for the
asked arch; on hip and cuda SDPA became IREE's fused attention dispatch, elsewhere it was decomposed;
under fp8/int8 no decode was hoisted to load time, and on GPUs the int8 weights reach the matmul
dispatches as i8 (no dispatch of their own converts them). The default run has every dtype on cpu
and vulkan and one cell per GPU target plus hip int8; -m slow runs all 35 cells.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import llmc
from llmc.compiler import vmfb
from llmc.models.llama.config import get_config
from llmc.models.llama.model import MLP, RMSNorm

D, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 128, 4, 2, 16, 100
ROWS = ["linear", "mlp", "rmsnorm", "attention", "embedding", "dot", "sigma"]
LINEAR_ROWS = {"linear", "mlp", "attention", "dot"}  # rows with linear layers (dot's W stays unquantized)
FORMAT = {"hip": "rocm-hsaco-fb", "cuda": "cuda-nvptx-fb", "xpu": "vulkan-spirv-fb", "vulkan": "vulkan-spirv-fb", "cpu": "embedded-elf-x86_64"}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

TARGETS = [("cpu", None), ("vulkan", None), ("hip", "gfx942"), ("hip", "gfx950"), ("hip", "gfx1100"), ("xpu", None), ("cuda", None)]
ALL = [(t, a, d) for t, a in TARGETS for d in ("f32", "f16", "bf16", "fp8", "int8")]
# Compile-only cells in the default run: one per GPU target here; hip gfx942 (fp8, bf16) and gfx950
# (bf16) are compiled by the two tests at the end of this file.
DEFAULT = [c for c in ALL if c[0] in ("cpu", "vulkan")] + [("hip", "gfx1100", "f16"), ("xpu", None, "fp8"), ("cuda", None, "bf16"),
                                                          ("hip", "gfx942", "int8")]


class Matrix(nn.Module):
    """Every row of the matrix, each its own output."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(D, 96)
        self.mlp = MLP(get_config("tiny").replace(dim=D, ffn_dim=FFN))
        self.norm = RMSNorm(D, 1e-6)
        self.q_proj = nn.Linear(D, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, D, bias=False)
        self.emb = nn.Embedding(VOCAB, D)
        self.sn_weight = nn.Parameter(torch.randn(96, D) / 8)
        self.register_buffer("u", F.normalize(torch.randn(96), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(D), dim=0))
        with torch.no_grad():
            self.norm.weight.copy_(1 + torch.randn(D) / 4)

    def forward(self, x, ids):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        attn = self.o_proj(attn.transpose(1, 2).flatten(2, 3))
        sigma = torch.dot(self.u, torch.mv(self.sn_weight, self.v))  # spectral normalization's sigma
        dot = F.linear(x, self.sn_weight / sigma)
        return self.linear(x), self.mlp(x), self.norm(x), attn, self.emb(ids), dot, sigma


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Matrix().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, D, generator=g)
    ids = torch.randint(0, VOCAB, (1, 8), generator=g)
    return m, (x, ids)


def _eager(m, args, dtype):
    m = copy.deepcopy(m).to(dtype)
    with torch.no_grad():
        return [o.float() for o in m(args[0].to(dtype), args[1])]


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _check_rows(got, want, min_cosine, rows=ROWS, sigma_rel=None):
    bad = []
    for name, g, w in zip(ROWS, got, want):
        if name not in rows:
            continue
        g = g.float()
        if name == "sigma":
            rel = abs(g.item() - w.item()) / abs(w.item())
            if rel > sigma_rel:
                bad.append(f"sigma: relative error {rel:.3g} > {sigma_rel}")
            continue
        c = _cosine(g, w)
        limit = min_cosine[name] if isinstance(min_cosine, dict) else min_cosine
        if not c >= limit:
            bad.append(f"{name}: cosine {c:.6f} < {limit}")
    assert not bad, "; ".join(bad)


def _compile(model, tmp_path, target, arch, dtype):
    m, args = model
    return llmc.compile(m, args, target=target, arch=arch, dtype=dtype, output=tmp_path / f"{target}-{arch}-{dtype}.vmfb")


def _run(art, args, dtype):
    mod = llmc.load(art)
    compute = art.read_manifest()["compute_dtype"]
    return [torch.as_tensor(o).float() for o in mod(*args)], compute  # inputs keep their f32 (cast inside)


@pytest.mark.parametrize("target,arch,dtype", DEFAULT, ids=["-".join(filter(None, c)) for c in DEFAULT])
def test_cell(model, tmp_path, target, arch, dtype):
    _cell(model, tmp_path, target, arch, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("target,arch,dtype", [c for c in ALL if c not in DEFAULT], ids=["-".join(filter(None, c)) for c in ALL if c not in DEFAULT])
def test_cell_slow(model, tmp_path, target, arch, dtype):
    _cell(model, tmp_path, target, arch, dtype)


def _cell(model, tmp_path, target, arch, dtype):
    if target == "vulkan":
        from conftest import vulkan_or_skip

        vulkan_or_skip(lock=False)  # compiles first: exclusive from the first Vulkan device it opens (conftest)
    m, args = model
    art = _compile(model, tmp_path, target, arch, dtype)
    manifest = art.read_manifest()
    info = vmfb.inspect(art.vmfb)
    assert info.formats == {FORMAT[target]}, info.summary()
    if target in ("hip", "cuda"):
        assert info.binary_archs == {arch or manifest["target"]["arch"]}, info.summary()
    ran = {p["name"]: p for p in manifest["passes"]}
    main = [d for d in info.dispatches if d.startswith("main$")]
    attention = [d for d in main if "_attention_" in d]
    if target in ("hip", "cuda"):  # SDPA reached IREE whole and became its fused attention op
        assert len(attention) == 1 and "decompose-attention" not in ran, info.dispatches
    else:  # decomposed by llmc (llvm-cpu: speed; SPIR-V: IREE cannot compile the fused op)
        assert not attention and ran["decompose-attention"]["rewrote"] == 1, info.dispatches
    # The 8 linear weights, and for int8 the embedding table too (its default; fp8's is float). Not
    # the spectral-norm W: it reaches its products through a division (only views are followed),
    # so it stays in the compute dtype.
    quantized = {"fp8": 8, "int8": 9}.get(dtype)
    if dtype in ("fp8", "int8"):
        assert ran[f"{dtype}-weights"]["rewrote"] == quantized, ran[f"{dtype}-weights"]
        # Decoded where used, not once at load into a widened copy (compiler/targets.py _NARROW_FLAGS).
        hoisted = [d for d in info.dispatches if d.startswith("_initializer") and ("i8x" in d or "f8E4M3" in d)]
        assert not hoisted, hoisted
    if dtype == "int8" and target != "cpu":
        # The i8 -> float conversion is fused into the dispatch that reads the weight (named after
        # its matmul): a dispatch of its own would write a widened weight every call.
        converts = [d for d in info.dispatches if "i8x" in d]
        assert not converts and any("matmul" in d for d in main), info.dispatches
    if target not in ("cpu", "vulkan"):
        return
    got, compute = _run(art, args, dtype)
    assert len(got) == len(ROWS)
    if dtype == "f32":
        want = _eager(m, args, torch.float32)
        _check_rows(got, want, 0.99999, sigma_rel=1e-5)
        for name, g, w in zip(ROWS, got, want):
            assert (g - w).abs().max() <= 1e-4 * w.abs().max(), name
    elif dtype in ("f16", "bf16"):
        want = _eager(m, args, TORCH[dtype])
        _check_rows(got, want, 0.999, sigma_rel=2e-3 if dtype == "f16" else 1e-2)
    else:
        want = _eager(m, args, torch.float32)
        _check_rows(got, want, 0.995 if dtype == "fp8" else 0.999, rows=LINEAR_ROWS, sigma_rel=2e-2)
        from llmc.compiler.diff_eager import same_quantized_weights

        same = copy.deepcopy(m)
        assert same_quantized_weights(same, art.params, manifest) == quantized
        want_same = _eager(same, args, TORCH[compute])
        _check_rows(got, want_same, 0.9999, sigma_rel=1e-3 if compute == "f16" else 1e-5)
        assert not all(torch.equal(a, b) for a, b in zip(want, want_same))  # the quantization is visible


def test_gfx950_decode_step_linear_compiles_and_the_iree_crash_is_pinned(tmp_path):
    """IREE 3.13 is killed by SIGFPE on gfx950 for f16/bf16 matmuls with M < 16 and K >= 128 (every
    decode-step linear); llmc turns gfx950's direct loads off (compiler/targets.py _GFX950_FLAGS).
    With them back on the crash must still be an exit-3 CompileError with a reproducer, never a raw
    crash; when IREE fixes it, this test says so and the flag can go."""
    from llmc.errors import CompileError

    torch.manual_seed(0)
    lin, x = nn.Linear(128, 64, bias=False), torch.randn(1, 1, 128)
    art = llmc.compile(lin, (x,), target="hip", arch="gfx950", dtype="bf16", output=tmp_path / "l.vmfb")
    assert vmfb.inspect(art.vmfb).binary_archs == {"gfx950"}
    assert "--iree-llvmgpu-use-direct-load=false" in art.read_manifest()["iree_flags"]
    with pytest.raises(CompileError, match="killed by SIGFPE") as e:
        llmc.compile(lin, (x,), target="hip", arch="gfx950", dtype="bf16", output=tmp_path / "crash.vmfb",
                     extra_iree_flags=("--iree-llvmgpu-use-direct-load=true",), repro_dir=tmp_path / "repro")
    assert e.value.exit_code == 3
    saved = [p.name for p in (tmp_path / "repro").rglob("*") if p.is_file()]
    assert any(n.endswith(".mlir") for n in saved) and not (tmp_path / "crash.vmfb").exists(), saved


class Llama8BAttention(nn.Module):
    """Llama-3-8B's attention block (hidden 4096, 32 heads, 8 KV heads, head_dim 128) up to o_proj."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(4096, 32 * 128, bias=False)
        self.k_proj = nn.Linear(4096, 8 * 128, bias=False)
        self.v_proj = nn.Linear(4096, 8 * 128, bias=False)
        self.o_proj = nn.Linear(32 * 128, 4096, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, 32, 128).transpose(1, 2)
        k = self.k_proj(x).view(b, n, 8, 128).transpose(1, 2)
        v = self.v_proj(x).view(b, n, 8, 128).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(attn.transpose(1, 2).flatten(2, 3))


SEED_CELLS = [("hip", "gfx942", "fp8", 1), ("hip", "gfx942", "fp8", 17), ("hip", "gfx942", "bf16", 1)]
# Not vulkan (llvmpipe) bf16: at these shapes iree-compile ran past 8 minutes (killed; xpu bf16 and
# llvmpipe fp8 take seconds) -- an open question, see the issue notes.
SEED_SLOW = [("hip", a, d, 1) for a in ("gfx950", "gfx1100") for d in ("fp8", "bf16")] + [
    (t, None, d, 1) for t in ("cuda", "xpu") for d in ("fp8", "bf16")
] + [("vulkan", None, "fp8", 1)]


@pytest.mark.parametrize("target,arch,dtype,n", SEED_CELLS + [pytest.param(*c, marks=pytest.mark.slow) for c in SEED_SLOW])
def test_8b_shaped_attention_to_o_proj_compiles(tmp_path, target, arch, dtype, n):
    """The issue's seed crash: Llama-8B in fp8 killed IREE's HIP path in the linear right after
    `attn.transpose(1,2).flatten(2,3)` (iree#20038). At the 8B shapes, decode (n = 1) and prefill."""
    torch.manual_seed(0)
    art = llmc.compile(Llama8BAttention().eval(), (torch.randn(1, n, 4096),), target=target, arch=arch, dtype=dtype,
                       output=tmp_path / "a.vmfb")
    info = vmfb.inspect(art.vmfb)
    assert info.formats == {FORMAT[target]}, info.summary()
    fused = [d for d in info.dispatches if "_attention_" in d]
    assert len(fused) == (1 if target in ("hip", "cuda") else 0), info.dispatches
    if dtype == "fp8":
        assert {p["name"]: p for p in art.read_manifest()["passes"]}["fp8-weights"]["rewrote"] == 4
