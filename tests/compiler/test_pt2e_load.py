"""A saved PT2E (Q/DQ) program loads without the user importing torchao (issue: int8 models).

The `quantized_decomposed` ops exist only once torch.ao.quantization.fx._decomposed is imported;
torch.export.load of a graph using them failed ("a zip file but not a loadable torch.export archive").
compiler/export.py registers them before loading. Both sides run in fresh processes, so nothing this
test process imported can register the ops for them.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

_WRITE = textwrap.dedent("""
    import sys, torch
    import torch.ao.quantization.fx._decomposed  # the writer has them (torchao's convert_pt2e imports this)
    qd = torch.ops.quantized_decomposed

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("wq", torch.randint(-127, 128, (8, 16), dtype=torch.int8))
            self.register_buffer("ws", torch.full((8,), 0.01))
            self.register_buffer("wz", torch.zeros(8, dtype=torch.int64))

        def forward(self, x):
            xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8), 0.05, 0, -128, 127, torch.int8)
            w = qd.dequantize_per_channel(self.wq, self.ws, self.wz, 0, -127, 127, torch.int8)
            return torch.nn.functional.linear(xd, w)

    torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])
""")

_READ_PLAIN = "import sys, torch; torch.export.load(sys.argv[1])"


@pytest.fixture(scope="module")
def qdq_pt2(tmp_path_factory):
    """The Q/DQ program, saved by a fresh process that has the quantized_decomposed ops (one writer for both tests)."""
    pt2 = tmp_path_factory.mktemp("qdq") / "q.pt2"
    subprocess.run([sys.executable, "-c", _WRITE, str(pt2)], check=True, capture_output=True, timeout=300)
    return pt2


def test_qdq_pt2_loads_and_imports_in_a_fresh_process(qdq_pt2):
    pt2 = qdq_pt2
    # Without the registration torch.export.load fails: what users saw from llmc before.
    plain = subprocess.run([sys.executable, "-c", _READ_PLAIN, str(pt2)], capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and "quantized_decomposed" in plain.stderr
    out = subprocess.run([sys.executable, "-m", "llmc.tools.llmc_opt", str(pt2), "--pipeline", "--target", "cpu"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for op in ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel"):
        assert f"torch.quantized_decomposed.{op}" in out.stdout


def test_qdq_linear_compiles_and_matches_eager(qdq_pt2, tmp_path):
    """The Q/DQ program's quantization scales are Python floats, f64 scalars in torch-mlir; with f64
    kept IREE 3.13 failed ("failed to legalize operation 'arith.truncf' ... (f64) -> f32"). A program
    without f64 tensors now compiles with f64 demoted (compiler/lower.py compile_flags); one with f64
    tensors still keeps them."""
    import torch

    import llmc
    from llmc.compiler import export

    pt2 = qdq_pt2
    art = llmc.compile(pt2, output=tmp_path / "q.vmfb")
    assert "--iree-input-demote-f64-to-f32=false" not in art.read_manifest()["iree_flags"]
    x = torch.randn(2, 16)
    want = export.load_pt2(pt2).module()(x)
    got = llmc.load(art)(x)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())

    class F64(torch.nn.Module):
        def forward(self, x):
            return x * 0.5 + 1.0

    art64 = llmc.compile(F64(), (torch.randn(3, dtype=torch.float64),), output=tmp_path / "f64.vmfb")
    assert "--iree-input-demote-f64-to-f32=false" in art64.read_manifest()["iree_flags"]
    x64 = torch.tensor([1e-300, 3.0, 1e300], dtype=torch.float64)  # beyond f32: demoted, these would be 0 / inf
    assert torch.equal(llmc.load(art64)(x64), x64 * 0.5 + 1.0)


_WRITE_CUSTOM = textwrap.dedent("""
    import sys, torch
    lib = torch.library.Library("mylib", "DEF")
    lib.define("q4_linear(Tensor x, Tensor w) -> Tensor")
    torch.library.impl(lib, "q4_linear", "CompositeExplicitAutograd")(lambda x, w: x @ w.float().t())
    torch.library.register_fake("mylib::q4_linear")(lambda x, w: x.new_empty(x.shape[0], w.shape[0]))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randint(-8, 8, (8, 16), dtype=torch.int8))

        def forward(self, x):
            return torch.ops.mylib.q4_linear(x, self.w)

    torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])
""")


class _PerGroup(torch.nn.Module):
    """4-bit weights with one scale per group of 8 (quantized_decomposed.dequantize_per_channel_group)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-8, 8, (8, 16), dtype=torch.int8))
        self.register_buffer("s", torch.rand(8, 2))
        self.register_buffer("z", torch.zeros(8, 2, dtype=torch.int64))

    def forward(self, x):
        w = torch.ops.quantized_decomposed.dequantize_per_channel_group(self.w, self.s, self.z, -8, 7, torch.int8, 8, torch.float32)
        return x @ w.t()


class _OneDnn(torch.nn.Module):
    """A backend-specific fused op, as Inductor's x86 lowering writes it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 127, (16, 8), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(8))
        self.register_buffer("wz", torch.zeros(8, dtype=torch.int64))

    def forward(self, x):
        xq = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
        return torch.ops.onednn.qlinear_pointwise(xq, 0.05, 0, self.w, self.ws, self.wz, None, 1.0, 0, torch.float32, "none", [0.0], "")


def test_unknown_quantized_ops_exit_2_naming_the_op(tmp_path):
    """Each refused before lowering, one line naming the op and what llmc accepts instead. Before:
    the custom op failed as 'a zip file but not a loadable torch.export archive', and the per-group
    program compiled without a word."""
    from conftest import llmc_in_process

    from llmc.compiler import export

    export.register_quantized_ops()
    custom = tmp_path / "custom.pt2"
    subprocess.run([sys.executable, "-c", _WRITE_CUSTOM, str(custom)], check=True, capture_output=True, timeout=300)
    cases = {custom: ("mylib.q4_linear", "not registered")}
    for name, module in (("group", _PerGroup()), ("onednn", _OneDnn())):
        path = tmp_path / f"{name}.pt2"
        torch.export.save(torch.export.export(module, (torch.randn(2, 16),)), str(path))
        cases[path] = (("quantized_decomposed.dequantize_per_channel_group", "per-group") if name == "group"
                       else ("onednn.qlinear_pointwise", "backend-specific"))
    for path, (op, why) in cases.items():
        r = llmc_in_process("compile", path, "-o", tmp_path / "out.vmfb")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (path.name, r.stderr)
        assert op in lines[0] and why in lines[0] and "quantize_per_tensor, dequantize_per_tensor" in lines[0], lines[0]
        assert not list(tmp_path.glob("out.*"))
