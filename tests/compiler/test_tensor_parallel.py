"""`--tensor-parallel N`: one module over N devices (IREE's @__device_0..N-1), run here on N local-task
devices in one process; hip and cuda compile-only.

What is checked: the split module generates the unsplit model's greedy tokens; each device loads
only its own weights and takes its own KV-cache shards (read from IREE's stream IR, where the
placement is decided); the .vmfb of an 8-way GPU build creates its executables on 8 devices; and a
device count or target that cannot work is refused with one line.
"""

from __future__ import annotations

import pytest
import torch

import llmc
from llmc.compiler import llm, placement
from llmc.compiler.pipeline import Dumper
from llmc.models.llama import tensor_parallel as tpm
from llmc.models.llama.config import CONFIGS, LlamaConfig
from llmc.models.llama.model import init_random
from llmc.tools.make_checkpoint import write_checkpoint
from tests.conftest import llmc_in_process, message_lines

MAX = 64
PROMPT = [1, 5, 9, 33, 7]


def eager_greedy(model, prompt, n):
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            t = int(model(torch.tensor([ids]))[0, -1].argmax())
            out.append(t)
            ids.append(t)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint("tiny", "hf", tmp_path_factory.mktemp("ckpt") / "tiny", "f32", 0)


@pytest.fixture(scope="module")
def tiny(checkpoint):
    return llm.load_llama(checkpoint)


@pytest.fixture(scope="module")
def tp2_f32(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2")
    return llmc.compile(checkpoint, output=out / "tiny.vmfb", max_seq_len=MAX, tensor_parallel=2, dump_ir=out / "ir")


def test_two_devices_generate_the_unsplit_models_16_tokens(tiny, tp2_f32):
    """f32: the same 16 greedy tokens as eager PyTorch on the unsplit model (the existing tests hold
    --tensor-parallel 1 to the same), with the module on 2 devices and its cache shards on theirs."""
    mod = llmc.load(tp2_f32)
    assert len(mod.devices) == 2 and mod.devices[0] is not mod.devices[1]
    assert mod.generate(PROMPT, 16) == eager_greedy(tiny, PROMPT, 16)


def test_manifest_records_the_split_and_the_flags_declare_two_devices(tp2_f32):
    m = tp2_f32.read_manifest()
    assert m["target"]["devices"] == 2
    assert "--iree-hal-target-device=local[0]" in m["iree_flags"] and "--iree-hal-target-device=local[1]" in m["iree_flags"]
    tp, cache = m["llm"]["tensor_parallel"], m["llm"]["cache"]
    assert cache["count"] == 2 * 2 * 2 and cache["shape"] == [1, 1, MAX, 16]  # 2 layers x 2 devices x (K, V), 1 KV head each
    assert tp["cache_devices"] == [0, 0, 1, 1, 0, 0, 1, 1]
    by_device = tp["param_bytes_by_device"]
    assert by_device[0] == by_device[1] > 0  # the unsplit rope tables are the last entry
    info = llmc_in_process("info", tp2_f32.vmfb)
    assert info.returncode == 0, info.stderr
    split = next(ln for ln in info.stdout.splitlines() if ln.startswith("split:"))
    assert split.startswith("split:    2 devices (local x2): 2 heads, 1 KV heads, 88 MLP channels and 128 vocabulary rows a device"), split
    weights = next(ln for ln in info.stdout.splitlines() if ln.startswith("weights:"))
    assert weights.startswith(f"weights:  device 0: {by_device[0] / 1e6:.1f} MB, device 1: {by_device[1] / 1e6:.1f} MB"), weights


@pytest.fixture(scope="module")
def tp2_stream(tp2_f32):
    """tp2_f32 (the tiny Llama split over 2 cpu devices) at IREE's stream level: the IR iree-compile got
    (the last file of its --dump-ir, as tools/bench_tp.py reads it) compiled to stream with the module's
    own flags; and the names of the parameters in its .irpa."""
    import iree.runtime as rt

    final = Dumper.last_mlir(tp2_f32.vmfb.parent / "ir")
    index = rt.ParameterIndex()
    index.load(str(tp2_f32.params))
    return placement.stream_ir(final.read_text(), tp2_f32.read_manifest()["iree_flags"]), {k for k, _ in index.items()}


def test_each_device_loads_only_its_own_weights(tp2_stream):
    stream, params = tp2_stream
    loads = placement.parameter_loads(stream)
    assert set(loads) == {0, 1}
    for d in (0, 1):
        mine = {k for k in params if k.startswith(f"shards.{d}.")}
        assert mine and mine <= set(loads[d]), mine - set(loads[d])
        assert not any(k.startswith(f"shards.{1 - d}.") for k in loads[d])
    shared = set(loads[0]) & set(loads[1])
    assert not shared, shared
    # Split weights are half each: what device 0 holds beyond device 1 is the unsplit rope tables.
    rope = sum(loads[0][k] for k in loads[0] if k.startswith("rope_"))
    assert sum(loads[0].values()) - rope == sum(loads[1].values())


def test_each_cache_shard_is_an_argument_on_its_device(tp2_stream):
    stream, _ = tp2_stream
    cache_devices = [d for _, d, _ in tpm.cache_order(2, 2)]
    for fn, first in (("prefill", 1), ("decode", 2)):
        got = placement.argument_devices(stream, fn)
        assert [got[first + i] for i in range(len(cache_devices))] == cache_devices
        assert all(got[i] == 0 for i in range(first))  # token ids, mask: device 0
    # tied: each updated shard is written into the buffer it came in (returned as that argument)
    assert "-> (!hal.buffer_view, %arg2, %arg3, %arg4, %arg5, %arg6, %arg7, %arg8, %arg9)" in stream


def test_bf16_two_devices_first_8_tokens_equal_the_unsplit_math(checkpoint, tmp_path):
    """cpu bf16 (bf16 weights, f32 math): the first 8 greedy tokens equal eager f32 on the
    bf16-rounded weights of the unsplit model."""
    art = llmc.compile(checkpoint, dtype="bf16", output=tmp_path / "tiny.vmfb", max_seq_len=MAX, tensor_parallel=2)
    rounded = llm.load_llama(checkpoint)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    assert llmc.load(art).generate(PROMPT, 8) == eager_greedy(rounded, PROMPT, 8)


def test_hip_eight_devices_compile_one_binary_created_on_each(tmp_path):
    config = LlamaConfig(dim=128, n_layers=1, n_heads=8, n_kv_heads=8, vocab_size=256, ffn_dim=128, name="tp8")
    art = llmc.compile(init_random(config, seed=0), target="hip", arch="gfx942", dtype="bf16", output=tmp_path / "tp8.vmfb",
                       max_seq_len=32, tensor_parallel=8)
    m = art.read_manifest()
    assert [f for f in m["iree_flags"] if f.startswith("--iree-hal-target-device=")] == [f"--iree-hal-target-device=hip[{i}]" for i in range(8)]
    assert placement.executables_created(art.vmfb) == 8


def test_llmc_diff_checks_a_split_module_against_the_checkpoint(checkpoint, tp2_f32):
    proc = llmc_in_process("diff", checkpoint, tp2_f32.vmfb)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "greedy tokens: 8 of 8" in proc.stdout and "PASS" in proc.stdout.splitlines()[-1]
    refused = llmc_in_process("diff", checkpoint, tp2_f32.vmfb, "--per-layer")
    assert refused.returncode == 2 and "split over 2 devices" in refused.stderr, refused.stderr


def test_fp8_split_module_matches_eager_on_each_devices_own_quantized_weights(checkpoint, tmp_path):
    """fp8 quantizes each device's part on its own (a column shard's scales span only its columns);
    llmc diff's same-weights reference rebuilds exactly those values, and the module matches it.
    --quant-exclude names the checkpoint's weights and keeps every device's slice of them."""
    import iree.runtime as rt

    art = llmc.compile(checkpoint, dtype="fp8", output=tmp_path / "tiny.vmfb", max_seq_len=MAX, tensor_parallel=2,
                       quant_exclude="lm_head.*")
    index = rt.ParameterIndex()
    index.load(str(art.params))
    names = [k for k, _ in index.items()]
    assert {"shards.0.lm_head.weight", "shards.1.lm_head.weight"} <= set(names)
    assert not any("lm_head" in k and k.endswith("_scale") for k in names), names
    proc = llmc_in_process("diff", checkpoint, art.vmfb)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    quantized = 2 * 7 * CONFIGS["tiny"].n_layers  # per device: 7 linears a layer (the LM head slices excluded)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("vs eager with the same fp8 weights"))
    assert f"({quantized} dequantized in PyTorch, profile f32): PASS" in line, line


@pytest.mark.parametrize("flags, names", [
    (["--tensor-parallel", "3"], ["--tensor-parallel=3", "2 KV heads", "use one of 1, 2"]),
    (["--tensor-parallel", "0"], ["--tensor-parallel=0", "1 or more"]),
    (["--tensor-parallel", "2", "--target", "xpu"], ["--tensor-parallel=2", "--target=xpu", "written into the module"]),
    (["--tensor-parallel", "2", "--target", "cuda", "--arch", "sm_90"], ["--arch=sm_90", "sm_89"]),
    (["--tensor-parallel", "2", "--arch", "portable"], ["--tensor-parallel=2", "several CPUs"]),
], ids=["not-dividing", "zero", "xpu", "sm_90", "portable"])
def test_a_split_that_cannot_work_is_refused_in_one_line(checkpoint, tmp_path, flags, names):
    proc = llmc_in_process("compile", checkpoint, "-o", tmp_path / "out.vmfb", *flags)
    assert proc.returncode == 2, proc.stderr
    lines = message_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("llmc: error: "), proc.stderr
    for n in names:
        assert n in lines[0], lines[0]
    assert not any(tmp_path.iterdir())
