"""The tensor-parallel Llama (models/llama/tensor_parallel.py) in eager PyTorch: the split program
computes what the unsplit model computes, holds 1/N of each split weight a device, and refuses a
device count that does not divide the model."""

import pytest
import torch

from llmc.models.llama import tensor_parallel as tpm
from llmc.models.llama.config import CONFIGS
from llmc.models.llama.model import LlamaDecode, LlamaPrefill, init_random, new_cache

MAX = 32


def _run(config, n, seed=0):
    llama = init_random(config, seed=seed, rope_positions=MAX)
    tp = tpm.TensorParallelLlama(llama, n)
    tokens = torch.randint(0, config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(1, 8, dtype=torch.int64)
    with torch.no_grad():
        ref = LlamaPrefill(llama)(tokens, *new_cache(config, MAX))
        got = tpm.TensorParallelPrefill(tp)(tokens, *tpm.new_cache(config, n, MAX))
        ref_step = LlamaDecode(llama)(tokens[:, -1:], mask, *ref[1:])
        got_step = tpm.TensorParallelDecode(tp)(tokens[:, -1:], mask, *got[1:])
    return llama, tp, ref, got, ref_step, got_step


@pytest.mark.parametrize("n", [1, 2])
def test_split_program_matches_the_llama(n):
    """Prefill then one decode step: logits within 1e-5 relative of the unsplit model (the products'
    K split over devices changes only the f32 summation order; N = 1 is bit-exact), and each device's
    cache holds its KV heads of the unsplit cache."""
    config = CONFIGS["tiny"]
    _, _, ref, got, ref_step, got_step = _run(config, n)
    for a, b in ((ref[0], got[0]), (ref_step[0], got_step[0])):
        assert a.shape == b.shape
        err = ((a - b).abs().max() / a.abs().max()).item()
        assert err <= (0.0 if n == 1 else 1e-5), err
    per = config.n_kv_heads // n
    for (layer, d, kv), t in zip(tpm.cache_order(config.n_layers, n), got_step[1:]):
        whole = ref_step[1 + 2 * layer + (kv == "v")]
        torch.testing.assert_close(t, whole[:, d * per:(d + 1) * per], rtol=1e-5, atol=1e-6)


def test_each_device_holds_its_part_of_every_split_weight():
    """Parameter bytes by device (device_of_param on the names the compiler sees): the split weights
    are 1/N each; only the norms (dim values each) and the rope tables (device 0) are not split."""
    config = CONFIGS["tiny"]
    llama, tp, *_ = _run(config, 2)
    by_device = [0, 0]
    for name, p in tp.named_parameters():
        by_device[tpm.device_of_param(name)] += p.numel()
    total = sum(p.numel() for p in llama.parameters())
    norms = (2 * config.n_layers + 1) * config.dim
    assert by_device == [(total - norms) // 2 + norms] * 2


def test_transfer_is_a_copy_in_eager_and_an_op_in_the_graph():
    x = torch.arange(6.0).view(2, 3)
    y = tpm.transfer(x, 1)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()

    class M(torch.nn.Module):
        def forward(self, x):
            return tpm.transfer(x * 2, 1) + 1

    ep = torch.export.export(M(), (x,))
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and "transfer" in str(n.target)]
    assert len(calls) == 1 and calls[0].args[1] == 1


@pytest.mark.parametrize("n, message", [
    (3, "--tensor-parallel=3 does not divide the 2 KV heads and the 4 attention heads and the MLP's 176 channels of tiny; use one of 1, 2"),
    (0, "--tensor-parallel=0: give a device count of 1 or more"),
])
def test_a_device_count_that_does_not_divide_the_model_is_refused(n, message):
    with pytest.raises(ValueError) as e:
        tpm.check_split(CONFIGS["tiny"], n)
    assert str(e.value) == message


def test_prefill_runs_the_last_layer_for_the_last_position_only():
    """As LlamaPrefill: every device's last layer makes K/V of every row but its query and MLP for the
    last position alone (the earlier layers' MLP sees every row); the logits match (the test above)."""
    from tests.conftest import attention_calls, rows_through

    config = CONFIGS["tiny"]
    tp = tpm.TensorParallelLlama(init_random(config, seed=3, rope_positions=MAX), 2)
    watched = {}
    for d, shard in enumerate(tp.shards):
        last, first = shard.model.layers[-1], shard.model.layers[0]
        watched |= {("last mlp", d): last.mlp, ("last q", d): last.self_attn.q_proj,
                    ("last k", d): last.self_attn.k_proj, ("first mlp", d): first.mlp}
    with torch.no_grad():
        rows, _ = rows_through(watched, lambda: tpm.TensorParallelPrefill(tp)(torch.arange(1, 8)[None], *tpm.new_cache(config, 2, MAX)))
    for d in range(2):
        assert rows[("last mlp", d)] == [1] and rows[("last q", d)] == [1], rows
        assert rows[("last k", d)] == [7] and rows[("first mlp", d)] == [7], rows
    # each device's one-row attention has a mask (all zeros): IREE 3.13 takes minutes over a maskless one on GPUs
    calls, _ = attention_calls(lambda: tpm.TensorParallelPrefill(tp)(torch.arange(1, 8)[None], *tpm.new_cache(config, 2, MAX)))
    assert calls == [(7, False, True)] * 2 * (config.n_layers - 1) + [(1, True, False)] * 2
