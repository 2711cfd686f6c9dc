"""A cpu decode step reads bf16/fp8/int8 weights where it multiplies them.

The bf16-weights, fp8-weights and int8-weights passes store a linear weight packed and narrow and
write a decode step's product as decode(P) * x summed over K. IREE must put the decode into the
dispatch that sums (a `matvec_like`), or every step writes and reads back a widened f32 copy of
every weight: 3x to 5x the memory traffic of a step that is bandwidth-bound. llmc used to turn on
IREE's aggressive fusion to get this; it no longer does (compiler/targets.py), so this pins the
fusion on IREE's default one, from the flow IR of the module llmc hands iree-compile.
"""

from __future__ import annotations

import re
import subprocess

import pytest

import llmc
from llmc.compiler.iree import iree_compile_path
from llmc.models.llama import model as llama_model
from llmc.models.llama.config import get_config

# the element type a packed weight of each dtype is stored in (bf16 as its bits)
NARROW = {"bf16": ("i16",), "fp8": ("f8E4M3FN", "i8"), "int8": ("i8",)}
CALL = re.compile(r"flow\.dispatch @(decode\$async_dispatch_\d+)::@(\S+?)(?:\[[^\]]*\])?\((.*?)\) : \((.*?)\) -> (.*)$")
TENSOR = re.compile(r"tensor<([0-9x?]+)x([a-zA-Z0-9]+)>")


def _elements(shape: str) -> int:
    n = 1
    for d in shape.split("x"):
        n *= int(d) if d != "?" else 1
    return n


def decode_calls(flow_ir: str) -> list[tuple[str, list[tuple[str, str]], list[tuple[str, str]]]]:
    """(dispatch name, operand tensor (shape, element type)s, result ones) for each dispatch call in @decode."""
    out = []
    for line in flow_ir.splitlines():
        m = CALL.search(line.strip())
        if m:
            out.append((m.group(2), TENSOR.findall(m.group(4)), TENSOR.findall(m.group(5))))
    return out


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int8"])
def test_cpu_decode_reads_packed_narrow_weights_in_its_matvecs(tmp_path, dtype):
    config = get_config("tiny")
    llama = llama_model.init_random(config, seed=5)
    art = llmc.compile(llama, dtype=dtype, arch="x86-64-v3", output=tmp_path / "m.vmfb", max_seq_len=64,
                       dump_ir=tmp_path / "ir")
    flags = art.read_manifest()["iree_flags"]
    final = sorted((tmp_path / "ir").glob("*.mlir"))[-1]  # what iree-compile was given
    flow = tmp_path / "flow.mlir"
    subprocess.run([iree_compile_path(), str(final), *flags, "--compile-to=flow", "-o", str(flow)], check=True,
                   capture_output=True, text=True)
    calls = decode_calls(flow.read_text())
    assert calls, "no dispatch calls found in @decode"
    # a packed linear weight: narrow elements, rank >= 3 ([N / group, K..., group])
    reads = [(name, ins, outs) for name, ins, outs in calls
             if any(t in NARROW[dtype] and len(shape.split("x")) >= 3 for shape, t in ins)]
    assert len(reads) >= 7 * config.n_layers, [c[0] for c in calls]  # q, k, v, o, gate, up, down per layer
    for name, ins, outs in reads:
        weight = max(_elements(shape) for shape, t in ins if t in NARROW[dtype])
        assert "matvec_like" in name, (name, ins, outs)
        # no widened copy: what the dispatch writes is a few partial sums per output, far smaller than the weight
        assert all(_elements(shape) * 4 <= weight for shape, _ in outs), (name, ins, outs)
