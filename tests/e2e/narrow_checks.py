"""Checks that several test files run on a cpu build of a narrow dtype (bf16, fp8, int8 weights):
which dispatch of a decode step reads each packed weight (from the flow IR of the module llmc gives
iree-compile), and that a prefill bucket computes what the dynamic prefill does. Used by
tests/e2e/test_narrow_decode.py, test_fp8.py and test_int8.py (one build serves all of a file's checks)."""

from __future__ import annotations

import os
import re

import numpy as np
from llmc.dtypes import by_name
import pytest
import torch

from llmc.compiler import targets, ukernels
from llmc.compiler.pipeline import Dumper
from llmc.models.llama.config import get_config

# the element type a packed weight of each dtype is stored in (bf16 as its bits)
NARROW = {"bf16": ("i16",), "fp8": ("f8E4M3FN", "i8"), "int8": ("i8",)}
CALL = re.compile(r"flow\.dispatch @([\w$]+)::@(\S+?)(?:\[[^\]]*\])?\((.*?)\) : \((.*?)\) -> (.*)$")
FUNC = re.compile(r"^\s*(?:util|func)\.func (?:public |private )?@([\w$]+)\(")
TENSOR = re.compile(r"tensor<([0-9x?]+)x([a-zA-Z0-9]+)>")
CONFIG = get_config("tiny")


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


def check_decode_reads(ir_dir, flow_ir: str, dtype: str, kernels: bool, n_layers: int = CONFIG.n_layers) -> None:
    """Every packed linear weight of @decode is read, narrow, by the dispatch that multiplies by it:
    llmc's kernel (kernels) or IREE's fused `matvec_like` (no kernels), never widened first."""
    final = Dumper.last_mlir(ir_dir)  # what iree-compile was given
    assert ("cpu-kernels" in final.name) == kernels
    calls = decode_calls(flow_ir)
    assert calls, "no dispatch calls found in @decode"
    # a packed linear weight: narrow elements, rank >= 3 ([N / group, K..., group])
    reads = [(name, ins, outs) for name, ins, outs in calls
             if any(t in NARROW[dtype] and len(shape.split("x")) >= 3 for shape, t in ins)]
    assert len(reads) >= 7 * n_layers, [c[0] for c in calls]  # q, k, v, o, gate, up, down per layer
    # fp8 on a cpu with AVX512_BF16: the pair layout's dot-product kernel (every K here is even)
    pairs = dtype == "fp8" and ukernels.fp8_pairs(targets.resolve("cpu", None, dtype).arch)
    kernel = "matvec_fp8dp" if pairs else f"matvec_{dtype}"
    for name, ins, outs in reads:
        weight = max(_elements(shape) for shape, t in ins if t in NARROW[dtype])
        assert (name == kernel) if kernels else ("matvec_like" in name), (name, ins, outs)
        # no widened copy: what the dispatch writes is a few partial sums per output, far smaller than the weight
        assert all(_elements(shape) * 4 <= weight for shape, _ in outs), (name, ins, outs)


def narrow_build_options(folder) -> dict:
    """llmc.compile options that make a default cpu build of a narrow dtype serve check_kernel_reads and
    check_bucket_matches_dynamic_prefill too: a 16-token prefill bucket, llmc's IR dumps and IREE's
    phases (for the flow IR)."""
    return {"prefill_buckets": (16,), "dump_ir": folder / "ir", "extra_iree_flags": (f"--dump-compilation-phases-to={folder / 'phases'}",)}


def kernels_or_skip(dtype: str) -> None:
    """Skip unless the C kernels serve this cpu for `dtype` (fail instead where CI requires them)."""
    why_not = ukernels.unavailable(targets.resolve("cpu", None, dtype))
    if why_not:
        if not os.environ.get("LLMC_REQUIRE_CPU_KERNELS"):  # set in CI (.ci/run), which installs gcc
            pytest.skip(why_not)
        pytest.fail(f"LLMC_REQUIRE_CPU_KERNELS is set but the kernels do not serve this cpu: {why_not}")


def check_kernel_reads(folder, dtype: str, n_layers: int) -> None:
    """check_decode_reads with the kernels, on a build made with narrow_build_options(folder)."""
    kernels_or_skip(dtype)
    flow = next((folder / "phases").glob("*.flow.mlir")).read_text()  # the end of IREE's flow phase
    check_decode_reads(folder / "ir", flow, dtype, kernels=True, n_layers=n_layers)


def check_bucket_matches_dynamic_prefill(mod, vocab_size: int) -> None:
    """bf16/fp8/int8 weights on cpu: the 16-token bucket computes what the dynamic prefill does (same
    narrow weights, same f32 math) and generate uses it. (Once tests/e2e/test_prefill_buckets.py's
    narrow-dtype cells, each with a build of its own.)"""
    prompt = torch.randint(3, vocab_size, (16,), generator=torch.Generator().manual_seed(116)).tolist()
    got = mod.generate(prompt, 8, stop_at_eos=False)
    assert mod.last_generation.prefill_function == "prefill_16"
    spec = mod.manifest["llm"]["cache"]
    zeros = [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    dyn = mod.host(mod.entry_points["prefill"].call_raw([np.asarray([prompt], dtype=np.int64), *zeros])[0])
    zeros = [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    bkt = mod.host(mod.entry_points["prefill_16"].call_raw([np.asarray([prompt], dtype=np.int64), np.asarray([16]), *zeros])[0])
    # the two prefills agree to f32 rounding (matmul blocking differs between a static and a dynamic M)
    assert np.abs(bkt - dyn).max() <= 1e-5 * np.abs(dyn).max()
    assert got[0] == int(np.argmax(dyn))
