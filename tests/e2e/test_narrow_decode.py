"""A cpu decode step reads bf16/fp8/int8 weights where it multiplies them.

The bf16-weights, fp8-weights and int8-weights passes store a linear weight packed and narrow. Where
every CPU of the module has AVX2 + FMA and a C compiler is at hand, a decode step's products are
dispatches of llmc's C kernels (compiler/ukernels.py), which read the packed weight itself.
Otherwise (LLMC_CPU_KERNELS=off here) they are decode(P) * x summed over K, and IREE must put the
decode into the dispatch that sums (a `matvec_like`), or every step writes and reads back a widened
f32 copy of every weight: 3x to 5x the memory traffic of a step that is bandwidth-bound. llmc used
to turn on IREE's aggressive fusion to get this; it no longer does (compiler/targets.py), so this
pins the fusion on IREE's default one. Both from the flow IR of the module llmc hands iree-compile.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import llmc
from llmc.compiler import targets, ukernels
from llmc.compiler.iree import iree_compile_path
from llmc.models.llama import model as llama_model
from llmc.models.llama.config import get_config

# the element type a packed weight of each dtype is stored in (bf16 as its bits)
NARROW = {"bf16": ("i16",), "fp8": ("f8E4M3FN", "i8"), "int8": ("i8",)}
CALL = re.compile(r"flow\.dispatch @([\w$]+)::@(\S+?)(?:\[[^\]]*\])?\((.*?)\) : \((.*?)\) -> (.*)$")
FUNC = re.compile(r"^\s*(?:util|func)\.func (?:public |private )?@([\w$]+)\(")
TENSOR = re.compile(r"tensor<([0-9x?]+)x([a-zA-Z0-9]+)>")


def _elements(shape: str) -> int:
    n = 1
    for d in shape.split("x"):
        n *= int(d) if d != "?" else 1
    return n


def decode_calls(flow_ir: str) -> list[tuple[str, list[tuple[str, str]], list[tuple[str, str]]]]:
    """(dispatch name, operand tensor (shape, element type)s, result ones) for each dispatch call in @decode."""
    out = []
    func = None
    for line in flow_ir.splitlines():
        f = FUNC.match(line)
        if f:
            func = f.group(1)
        m = CALL.search(line.strip())
        if m and func in ("decode", "decode$async"):
            out.append((m.group(2), TENSOR.findall(m.group(4)), TENSOR.findall(m.group(5))))
    return out


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "no-kernels"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int8"])
def test_cpu_decode_reads_packed_narrow_weights_in_its_matvecs(tmp_path, monkeypatch, dtype, kernels):
    why_not = ukernels.unavailable(targets.resolve("cpu", "x86-64-v3", dtype)) if kernels else None
    if why_not and not os.environ.get("LLMC_REQUIRE_CPU_KERNELS"):  # set in CI (.ci/run), which installs gcc
        pytest.skip(why_not)
    monkeypatch.setenv(ukernels.ENV, "on" if kernels else "off")
    config = get_config("tiny")
    llama = llama_model.init_random(config, seed=5)
    art = llmc.compile(llama, dtype=dtype, arch="x86-64-v3", output=tmp_path / "m.vmfb", max_seq_len=64,
                       dump_ir=tmp_path / "ir")
    flags = art.read_manifest()["iree_flags"]
    final = sorted((tmp_path / "ir").glob("*.mlir"))[-1]  # what iree-compile was given
    assert ("cpu-kernels" in final.name) == kernels
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
        assert (name == f"matvec_{dtype}") if kernels else ("matvec_like" in name), (name, ins, outs)
        # no widened copy: what the dispatch writes is a few partial sums per output, far smaller than the weight
        assert all(_elements(shape) * 4 <= weight for shape, _ in outs), (name, ins, outs)
