"""compiler/greedy.py: a function's `_greedy` twin, compiled for cpu and run, chooses the token numpy's argmax
chooses over the row the function returns (first maximum, first NaN), as the token fed back and as the choice
(-1 for a non-finite one), for f32,
bf16 and f16 rows, and returns the function's own results unchanged. Rows are crafted: ties that exist only
after the cast to bf16/f16 (the caller reads the rounded row), NaN and infinities at the first, a middle and
the last position. The LLM side (manifest, generate(), the cache updated in place) is in
tests/e2e/test_llama_generate.py."""

import numpy as np
import pytest
import torch

from llmc.compiler import export, greedy, importer, lower
from llmc.compiler.iree import iree_compile_path
from llmc.errors import CompileError

V = 203  # odd: no vector width divides it


class _Row(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype), x * 2


def _compile(tmp_path, dtype, dims=(1, 1, V)):
    """The program imported, its greedy twin added, compiled for the host CPU; (main, main_greedy) callables."""
    import subprocess

    import iree.runtime as rt

    ep = torch.export.export(_Row(dtype), (torch.zeros(*dims),))
    module, *_ = importer.import_programs([(export.Exported(ep, ""), "main")])
    greedy.add_greedy(module, "main", "main_greedy", 0)
    src, vmfb = tmp_path / "m.mlir", tmp_path / "m.vmfb"
    src.write_text(str(module))
    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host",
             "--iree-input-demote-f64-to-f32"]
    subprocess.run([iree_compile_path(), str(src), *flags, "-o", str(vmfb)], check=True, capture_output=True, text=True)
    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(config.vm_instance, str(vmfb)))
    return ctx.modules.module["main"], ctx.modules.module["main_greedy"]


def _widened(row) -> np.ndarray:
    a = np.asarray(row.to_host() if hasattr(row, "to_host") else row)
    if a.dtype == np.uint16 or str(a.dtype) == "bfloat16":  # a bf16 result as iree.runtime returns it
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def _rows(dtype) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(V).astype(np.float32)
    rows = [base]
    tie = base.copy(); tie[[40, 90, 150]] = 9.0  # an exact tie: the first wins
    rows.append(tie)
    near = base.copy(); near[[30, 170]] = [9.0, 9.0 + 2.0 ** -10]  # equal once rounded to bf16/f16, not in f32
    rows.append(near)
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 101, V - 1):
            r = base.copy(); r[at] = bad
            rows.append(r)
    two_nans = base.copy(); two_nans[[77, 12]] = np.nan  # the first NaN
    rows.append(two_nans)
    rows.append(np.full(V, -np.inf, dtype=np.float32))  # every logit -inf: 0 and -inf, so -1
    rows.append(np.full(V, np.inf, dtype=np.float32))
    neg = -np.abs(base) - 1; neg[5] = -np.inf
    rows.append(neg)  # all negative: the maximum is not 0
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_twin_is_numpys_argmax_of_the_returned_row(tmp_path, dtype):
    main, main_greedy = _compile(tmp_path, dtype)
    for i, x in enumerate(_rows(dtype)):
        x3 = x.reshape(1, 1, V)
        plain = main(x3)
        twin = main_greedy(x3)
        assert len(twin) == len(plain) + 2
        row = _widened(plain[0]).reshape(-1)
        index = int(np.argmax(row))
        want = index if np.isfinite(row[index]) else -1
        token, chosen = np.asarray(twin[-2].to_host()), np.asarray(twin[-1].to_host())
        assert token.shape == chosen.shape == (1, 1) and token.dtype == chosen.dtype == np.int64
        # the token fed back is numpy's index even where the choice is -1 (a valid row of the embedding table)
        assert int(token[0, 0]) == index and int(chosen[0, 0]) == want, f"row {i}: got {token[0, 0]} / {chosen[0, 0]}, numpy {index} / {want}"
        for a, b in zip(plain, twin[:len(plain)]):  # the function's own results, unchanged
            assert np.array_equal(_widened(a), _widened(b), equal_nan=True)
        if dtype != torch.float32 and i == 2:
            assert row[30] == row[170] and want == 30  # the tie the cast made


def test_greedy_twin_of_a_rank_one_row(tmp_path):
    main, main_greedy = _compile(tmp_path, torch.float32, dims=(V,))
    x = _rows(torch.float32)[1]
    assert int(np.asarray(main_greedy(x)[-2].to_host())[0, 0]) == 40


def test_refusals_name_the_function():
    class NotARow(torch.nn.Module):
        def forward(self, x):
            return x + 1, x

    for shape, needle in (((2, 5), "not a \\[1, ..., 1, vocab\\]"),):
        ep = torch.export.export(NotARow(), (torch.zeros(*shape),))
        module, *_ = importer.import_programs([(export.Exported(ep, ""), "main")])
        with pytest.raises(CompileError, match=f"main_greedy: main's result 0 is .*{needle}"):
            greedy.add_greedy(module, "main", "main_greedy", 0)
        with pytest.raises(CompileError, match="no function decode"):
            greedy.add_greedy(module, "decode", "decode_greedy", 0)
        with pytest.raises(CompileError, match="already has a function"):
            greedy.add_greedy(module, "main", "main", 0)


def test_signature_appends_the_token():
    sig = {"function": "decode", "inputs": [], "outputs": {"type": "tuple", "children": [{"type": "tensor", "dtype": "float32", "shape": [1, 1, 8]}]}}
    got = greedy.signature(sig, "decode_greedy")
    assert got["function"] == "decode_greedy" and sig["function"] == "decode"  # a copy
    assert got["outputs"]["children"][1:] == [{"type": "tensor", "dtype": "int64", "shape": [1, 1], "role": "greedy_token"},
                                              {"type": "tensor", "dtype": "int64", "shape": [1, 1], "role": "greedy_chosen"}]
    assert lower.Entry.__dataclass_fields__["greedy"].default is False
    with pytest.raises(CompileError, match="decode_greedy: decode does not return a tuple"):
        greedy.signature({"function": "decode", "inputs": [], "outputs": {"type": "tensor"}}, "decode_greedy")
    # next_token only where add_greedy added it, and only after a [1, 1] int64 token
    tok = {"function": "decode", "inputs": [{"path": "[0][0]", "name": "token", "kind": "tensor", "dtype": "int64", "shape": [1, 1]}],
           "outputs": sig["outputs"]}
    assert greedy.signature(tok, "decode_greedy")["inputs"] == tok["inputs"]
    assert greedy.signature(tok, "decode_greedy", next_token=True)["inputs"][1] == {
        "path": "[0][1]", "name": "next_token", "kind": "tensor", "dtype": "int64", "shape": [1, 1]}
    with pytest.raises(CompileError, match="first input is not a \\[1, 1\\] int64 token"):
        greedy.signature(sig, "decode_greedy", next_token=True)
    # the manifest's record reads the indices from those roles
    assert greedy.record({"decode_greedy": got}, "decode") == {"function": "decode_greedy", "token_output": 1, "chosen_output": 2}


def test_twin_keeps_the_ties_and_holds_the_two_reductions():
    """The twin's cache-like result stays tied to its argument (what lets generate() pass the cache buffers in
    and read them back updated), its own two results are untied, and the choice is the maximumf / minsi pair
    (a select chain instead stays a scalar loop in IREE: compiler/greedy.py)."""
    import re

    class Step(torch.nn.Module):
        def forward(self, x, state):
            return x * 2, state + 1

    ep = torch.export.export(Step(), (torch.zeros(1, 1, V), torch.zeros(4)))
    module, *_ = importer.import_programs([(export.Exported(ep, ""), "main")], tied_results={"main": {1: 1}})
    greedy.add_greedy(module, "main", "main_greedy", 0)
    text = str(module)
    head = lambda name: re.search(rf"func\.func @{name}\((.*?)\) -> \((.*?)\) (attributes|\{{)", text).group(2)
    plain, twin = head("main"), head("main_greedy")
    assert "{iree.abi.tied = 1 : index}" in plain
    assert twin.startswith(plain + ", ")  # the same results and ties, then the token and the choice
    # tensors only: a VM integer result would make IREE's `$async` form wait for the step inside the call
    assert twin[len(plain):] == ", !torch.vtensor<[1,1],si64>, !torch.vtensor<[1,1],si64>"
    body = text[text.index(f"func.func private @__llmc_greedy_1x1x{V}_f32"):]
    body = body[:body.index("\n  }\n")]
    assert "arith.maximumf" in body and "arith.minsi" in body and "arith.constant -1 : i64" in body
