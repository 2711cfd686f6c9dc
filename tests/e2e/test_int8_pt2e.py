"""int8 PT2E programs (issue: int8 models): a conv net and an MLP quantized by torchao's PT2E flow with
signed (XNNPACK-style) and unsigned (X86InductorQuantizer) activations, saved as .pt2, compiled by
`llmc compile` for cpu and vulkan (lavapipe) and run against eager PT2E on 32 seeded inputs.

Acceptance per model and target: top-1 equal on >= 31 of 32 rows, max abs error <= 3 output
quantization steps (the scale of the last dequantize), .vmfb + .irpa under 0.4x the float weights'
bytes; the passes fired (qdq-contractions recorded integer contractions, int8-signed rewrote the
uint8 activations) and IREE formed i8 x i8 -> i32 contractions (dispatch names). GPU targets other
than vulkan compile only here: their modules are inspected for the same integer dispatches.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import llmc_in_process, message_lines, vulkan_or_skip

import llmc
from llmc.compiler import vmfb
from llmc.models import quantized

CASES = [(m, s) for m in ("convnet", "mlp") for s in quantized.SCHEMES]
N_ROWS = 32


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """(model, scheme) -> (.pt2 path, converted eager module, float weight bytes, example batch)."""
    root = tmp_path_factory.mktemp("pt2e")
    out = {}
    for name, scheme in CASES:
        model, args = quantized.build(name, seed=11)
        float_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() > 1)
        converted = quantized.pt2e(model, args, scheme)
        path = root / f"{name}_{scheme}.pt2"
        quantized.save(converted, args, path)
        out[name, scheme] = (path, converted, float_bytes, args[0].shape[0])
    return out


def _output_step(converted, want: torch.Tensor) -> float:
    """One output quantization step: the scale of the dequantize the program returns (XNNPACK-style
    models quantize their output); a model returning its last linear in float (X86InductorQuantizer)
    has none, and gets one int8 step of its output's range, max|eager| / 127."""
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    if "dequantize_per_tensor" in str(out.target):
        return float(out.args[1])
    return float(want.abs().max()) / 127


def _rows(example_batch: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(2024)
    return torch.randn(N_ROWS, *shape, generator=g)


# Every (model, scheme) on cpu; on vulkan (lavapipe, which runs alone under xdist) the conv net with
# unsigned activations (int8-signed's rewrite) and the MLP with signed ones, so each model and each
# scheme runs there. The other two vulkan cells run with -m slow.
VULKAN_SLOW = {("convnet", "xnnpack"), ("mlp", "x86")}
CELLS = [pytest.param(n, s, t, marks=[pytest.mark.slow] if t == "vulkan" and (n, s) in VULKAN_SLOW else [], id=f"{n}-{s}-{t}")
         for n, s in CASES for t in ("cpu", "vulkan")]


@pytest.mark.parametrize("name,scheme,target", CELLS)
def test_pt2e_program_matches_eager(programs, name, scheme, target, tmp_path):
    if target == "vulkan":
        vulkan_or_skip(lock=False)  # compiles first: exclusive from the first Vulkan device it opens (conftest)
    path, converted, float_bytes, batch = programs[name, scheme]
    # In process: `llmc compile` is this call behind the CLI (its exit codes: the refusal tests below).
    llmc.compile(path, target=target, output=tmp_path / "q.vmfb")
    module = llmc.load(tmp_path / "q.vmfb")
    example = next(iter(torch.export.load(str(path)).example_inputs[0]))
    xs = _rows(batch, example.shape[1:])
    with torch.no_grad():
        want = torch.cat([converted(xs[i:i + batch]) for i in range(0, N_ROWS, batch)])
    got = torch.cat([torch.as_tensor(module(xs[i:i + batch])) for i in range(0, N_ROWS, batch)])
    step = _output_step(converted, want)
    err = float((got - want).abs().max())
    top1 = int((got.argmax(1) == want.argmax(1)).sum())
    assert top1 >= N_ROWS - 1, f"top-1 equal on {top1}/{N_ROWS} rows"
    assert err <= 3 * step, f"max abs error {err:.3g} = {err / step:.2f} output steps (limit 3)"
    size = (tmp_path / "q.vmfb").stat().st_size + (tmp_path / "q.irpa").stat().st_size
    assert size < 0.4 * float_bytes, f".vmfb + .irpa {size} B = {size / float_bytes:.3f}x the float weights ({float_bytes} B)"

    manifest = json.loads((tmp_path / "q.json").read_text())
    stats = {p["name"]: p for p in manifest["passes"]}
    layers = manifest["quantization"]
    integer = [rec for rec in layers if rec["form"] == "integer"]
    assert len(integer) == len(layers) > 0, layers  # every conv / linear of these models: int8 x int8
    if name == "convnet" and target == "cpu":  # qdq-contractions' im2col on the int8 input
        assert stats["qdq-contractions"]["forms"]["conv: im2col of the int8 input + int8 matmul"] == 6
    if scheme == "x86":
        assert stats["int8-signed"]["rewrote"] > 0
        assert all(rec["operands"][0]["dtype"] == "uint8" and "compiled_as" in rec["operands"][0] for rec in integer)
    else:
        assert stats["int8-signed"]["rewrote"] == 0
    names = [d for d in vmfb.inspect(tmp_path / "q.vmfb").dispatches if d.startswith("main$")]
    integer_kernels = [d for d in names if ("conv" in d or "matmul_like" in d) and d.endswith("i8xi8xi32")]
    assert len(integer_kernels) >= 4, names
    # no contraction left in f32 (max pooling, which IREE names a conv, is not one)
    assert not [d for d in names if "matmul" in d and d.endswith("_f32")], names


@pytest.mark.parametrize("target,arch", [("hip", "gfx942"), ("hip", "gfx1100"), ("cuda", "sm_90"), ("xpu", "arc")])
def test_pt2e_compiles_to_integer_kernels_on_gpu_targets(programs, target, arch, tmp_path):
    path = programs["mlp", "x86"][0]
    art = llmc.compile(path, target=target, arch=arch, output=tmp_path / "q.vmfb")
    info = vmfb.inspect(art.vmfb)
    assert all(e.valid for e in info.executables) and info.executables
    matmuls = [d for d in info.dispatches if d.startswith("main$") and "matmul" in d]
    assert len(matmuls) == 4 and all(d.endswith("i8xi8xi32") for d in matmuls), info.dispatches


def test_qdq_float_form_on_a_device_without_int64(programs, tmp_path):
    """Mali valhall4 has no Int64: IREE's integer contractions failed there ("failed to legalize
    operation 'vector.broadcast'"); qdq-float writes Q/DQ as f32 math and it compiles."""
    path = programs["convnet", "x86"][0]
    art = llmc.compile(path, target="vulkan", arch="valhall4", output=tmp_path / "q.vmfb")
    manifest = art.read_manifest()
    stats = {p["name"]: p for p in manifest["passes"]}
    assert stats["qdq-float"]["rewrote"] > 0
    info = vmfb.inspect(art.vmfb)
    assert not [d for d in info.dispatches if "i8xi8xi32" in d], info.dispatches
    assert [d for d in info.dispatches if "conv" in d and d.endswith("_f32")]


def test_int8_program_refused_for_a_device_without_8bit_storage(programs, tmp_path):
    path = programs["mlp", "xnnpack"][0]
    r = llmc_in_process("compile", path, "--target", "vulkan", "--arch", "adreno", "-o", tmp_path / "q.vmfb")
    assert r.returncode == 2, r.stderr
    lines = message_lines(r.stderr)
    assert len(lines) == 1 and "8-bit storage" in lines[0] and "adreno" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())


def test_int8_math_float_matches_eager_on_cpu(programs, tmp_path):
    """--int8-math float (the form valhall4 gets) run here: dequantized values are bit-identical to
    eager PT2E's and the contractions are f32, so the output is within one output step of eager."""
    path, converted, _, batch = programs["convnet", "xnnpack"]
    art = llmc.compile(path, int8_math="float", output=tmp_path / "q.vmfb")
    stats = {p["name"]: p for p in art.read_manifest()["passes"]}
    assert stats["qdq-float"]["rewrote"] > 0
    assert not [d for d in vmfb.inspect(art.vmfb).dispatches if "i8xi8xi32" in d]
    example = next(iter(torch.export.load(str(path)).example_inputs[0]))
    xs = _rows(batch, example.shape[1:])
    module = llmc.load(art)
    with torch.no_grad():
        want = torch.cat([converted(xs[i:i + batch]) for i in range(0, N_ROWS, batch)])
    got = torch.cat([torch.as_tensor(module(xs[i:i + batch])) for i in range(0, N_ROWS, batch)])
    assert float((got - want).abs().max()) <= 1.0001 * _output_step(converted, want)
    assert int((got.argmax(1) == want.argmax(1)).sum()) >= N_ROWS - 1


@pytest.mark.parametrize("arch,dot,absent", [("cascadelake", "vpdpwssd", None), ("znver3", "vpmaddwd", "vpdpwssd")])
def test_int8_matmuls_use_the_cpus_dot_product_instructions(programs, arch, dot, absent, tmp_path):
    """On a CPU with AVX-512 VNNI (cascadelake) IREE's data-tiled s8 x s8 kernel uses the VNNI dot
    product vpdpwssd (operands sign-extended to 16 bits); on AVX2 without VNNI (znver3) vpmaddwd.
    Compile-only: read from the assembly IREE writes for the executables (this machine may lack VNNI)."""
    path = programs["mlp", "x86"][0]
    dump = tmp_path / "asm"
    llmc.compile(path, arch=arch, output=tmp_path / "q.vmfb", extra_iree_flags=(f"--iree-hal-dump-executable-intermediates-to={dump}",))
    asm = "\n".join(p.read_text() for p in dump.glob("*.s"))
    assert re.search(rf"\b{dot}\b", asm), f"no {dot} in the {arch} executables"
    if absent:
        assert not re.search(rf"\b{absent}\b", asm)


def test_converted_module_compiles_from_python(programs, tmp_path):
    """llmc.compile(converted_module, example_args): the PT2E GraphModule itself, not a saved .pt2."""
    _, converted, _, batch = programs["mlp", "x86"]
    x = torch.randn(batch, 256, generator=torch.Generator().manual_seed(3))
    art = llmc.compile(converted, (x,), output=tmp_path / "m.vmfb")
    records = art.read_manifest()["quantization"]
    assert [r["form"] for r in records] == ["integer"] * 4 and records[0]["operands"][0]["dtype"] == "uint8"
    with torch.no_grad():
        want = converted(x)
    got = torch.as_tensor(llmc.load(art)(x))
    assert float((got - want).abs().max()) <= 3 * _output_step(converted, want)


class _QConv(torch.nn.Module):
    """One Q/DQ conv2d with the shapes the int8 im2col must get right: a non-square kernel, unequal
    strides and padding, dilation (the slice + stack gather), uint8 activations with a zero point
    far from 128 (int8-signed shifts the zero-point padding too), channels-last weights."""

    def __init__(self, kernel, stride, padding, dilation, zp, channels_last):
        super().__init__()
        w = torch.randint(-127, 128, (6, 4, *kernel), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
        self.register_buffer("w", w.to(memory_format=torch.channels_last) if channels_last else w)
        self.register_buffer("ws", torch.rand(6, generator=torch.Generator().manual_seed(2)) * 0.01 + 0.001)
        self.register_buffer("wz", torch.zeros(6, dtype=torch.int64))
        self.args = (stride, padding, dilation)
        self.zp = zp

    def forward(self, x):
        qd = torch.ops.quantized_decomposed
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.02, self.zp, 0, 255, torch.uint8), 0.02, self.zp, 0, 255, torch.uint8)
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        stride, padding, dilation = self.args
        return torch.nn.functional.conv2d(xd, w, None, stride, padding, dilation)


@pytest.mark.parametrize("kernel,stride,padding,dilation,zp,channels_last,dynamic", [
    ((3, 2), (2, 1), (1, 2), (1, 1), 200, False, False),
    ((3, 3), (1, 2), (2, 1), (2, 2), 0, True, False),
    ((3, 3), (1, 1), (1, 1), (1, 1), 130, False, True),
])
def test_int8_im2col_shapes_match_eager(kernel, stride, padding, dilation, zp, channels_last, dynamic, tmp_path):
    """Static shapes take llmc's int8 im2col; a dynamic batch is left to IREE (declined: tracing the
    gather with a symbolic batch specialized it), and runs right at other batch sizes."""
    from torch.export import Dim

    from llmc.compiler import export

    export.register_quantized_ops()
    model = _QConv(kernel, stride, padding, dilation, zp, channels_last)
    x = torch.randn(2, 4, 9, 11, generator=torch.Generator().manual_seed(4))
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=8)},) if dynamic else None)
    art = llmc.compile(ep, output=tmp_path / "c.vmfb")
    stats = {p["name"]: p for p in art.read_manifest()["passes"]}["qdq-contractions"]
    if dynamic:
        assert stats["declined"] == 1 and stats["decline_reasons"] == ["conv on llvm-cpu kept as a convolution: dynamic shape"]
    else:
        assert stats["forms"] == {"conv: im2col of the int8 input + int8 matmul": 1}
    module = llmc.load(art)
    for batch in ((2, 5) if dynamic else (2,)):
        xs = torch.randn(batch, 4, 9, 11, generator=torch.Generator().manual_seed(batch))
        want = model(xs)
        got = torch.as_tensor(module(xs))
        assert got.shape == want.shape
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
