"""Tensor-parallel Llama: the Megatron split of one Llama over N devices, written as one program.

The program names the device of every value: a tensor crosses to device d only through
`transfer(x, d)` (the custom op `llmc::transfer`, a copy in eager PyTorch), and each parameter
belongs to the device its name says (`shards.<d>.` ...). The compiler turns `transfer` into IREE's
`flow.tensor.transfer` (compiler/importer.py) and pins each parameter's global to its device,
so IREE runs each op on the device of its operands: one module, N devices, the copies between them
inside it (the way sharktank expresses its sharded Llamas on IREE).

The split, for N devices (N must divide the KV heads, and so the query heads):
- attention: device d holds query heads [d*H/N, (d+1)*H/N) and KV heads [d*KV/N, (d+1)*KV/N) of
  q/k/v_proj (their rows), the matching columns of o_proj, and its part of the KV cache. A query head
  h reads KV head h // (H/KV), which lies on the same device.
- MLP: device d holds rows [d*F/N, (d+1)*F/N) of gate_proj and up_proj and those columns of down_proj.
- o_proj and down_proj give each device a partial sum of the whole output; an all-reduce (every
  device receives every other's partial and adds all N in device order, so the replicas stay
  bit-identical) gives each device the full residual update. The residual stream is replicated.
- embedding and LM head: split by vocabulary rows (ceil(V/N) a device). Device d gathers the rows of
  the ids in its range, zeros elsewhere, and the all-reduce adds them (exact: one nonzero term). Each
  device's LM head gives its slice of the logits, gathered on device 0. A tied table is one tensor.
- norms: each device keeps its own copy (they are `dim` values) and normalises its replica.
- positions (rope tables), token ids and the attention mask: on device 0, sent to each device once
  a call.

Summation order inside the products differs from the unsplit model (a K split over devices), so f32
results agree to rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from llmc.models.llama.config import LlamaConfig
from llmc.models.llama.model import Attention, Llama, RMSNorm, additive_mask, last_position, last_row_bias

TRANSFER_OP = "llmc::transfer"
SHARD_PREFIX = "shards."  # parameter names `shards.<d>.<the Llama's own name>`: device d's


@torch.library.custom_op(TRANSFER_OP, mutates_args=())
def transfer(x: torch.Tensor, device: int) -> torch.Tensor:
    """`x` placed on the module's logical device `device` (0..N-1). Eager: a copy."""
    return x.clone()


@transfer.register_fake
def _(x, device):
    return torch.empty_like(x)


def device_of_param(name: str) -> int:
    """The device holding parameter `name` (names as the module's globals carry them): `shards.<d>.`
    names device d's; everything else is device 0's."""
    if name.startswith(SHARD_PREFIX):
        head = name[len(SHARD_PREFIX):].split(".", 1)[0]
        if head.isdigit():
            return int(head)
    return 0


def check_split(config: LlamaConfig, n: int, *, where: str = "--tensor-parallel") -> None:
    """Raise ValueError unless `n` devices can split `config` (heads, KV heads, MLP, vocabulary)."""
    if n < 1:
        raise ValueError(f"{where}={n}: give a device count of 1 or more")
    problems = []
    if config.n_kv_heads % n:
        problems.append(f"the {config.n_kv_heads} KV heads")
    if config.n_heads % n:
        problems.append(f"the {config.n_heads} attention heads")
    if config.ffn_dim % n:
        problems.append(f"the MLP's {config.ffn_dim} channels")
    if config.vocab_size < n:
        problems.append(f"the {config.vocab_size}-token vocabulary")
    if problems:
        divisors = [d for d in range(1, config.n_kv_heads + 1) if config.n_kv_heads % d == 0
                    and config.n_heads % d == 0 and config.ffn_dim % d == 0]
        raise ValueError(f"{where}={n} does not divide {' and '.join(problems)} of {config.name}; "
                         f"use one of {', '.join(map(str, divisors))}")


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _linear(w: torch.Tensor) -> nn.Linear:
    """An nn.Linear around `w` (no copy)."""
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = _param(w)
    return lin


def _norm(src: RMSNorm) -> RMSNorm:
    """A copy of a norm: each device's own tensor (the compiler keeps one parameter per storage)."""
    with torch.device("meta"):
        norm = RMSNorm(src.weight.shape[0], src.eps)
    norm.weight = _param(src.weight.detach().clone())
    return norm


class _ShardAttention(Attention):
    """Attention over a device's heads: Attention's own qkv/out with fewer heads (out gives a partial sum)."""

    def __init__(self, src: Attention, d: int, n: int):
        nn.Module.__init__(self)
        hd = src.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = src.n_heads // n, src.n_kv_heads // n, hd
        q, kv = self.n_heads * hd, self.n_kv_heads * hd
        self.q_proj = _linear(src.q_proj.weight[d * q:(d + 1) * q])
        self.k_proj = _linear(src.k_proj.weight[d * kv:(d + 1) * kv])
        self.v_proj = _linear(src.v_proj.weight[d * kv:(d + 1) * kv])
        self.o_proj = _linear(src.o_proj.weight[:, d * q:(d + 1) * q])


class _ShardMLP(nn.Module):
    def __init__(self, src, d: int, n: int):
        super().__init__()
        f = src.gate_proj.weight.shape[0] // n
        self.gate_proj = _linear(src.gate_proj.weight[d * f:(d + 1) * f])
        self.up_proj = _linear(src.up_proj.weight[d * f:(d + 1) * f])
        self.down_proj = _linear(src.down_proj.weight[:, d * f:(d + 1) * f])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _ShardLayer(nn.Module):
    def __init__(self, src, d: int, n: int):
        super().__init__()
        self.input_layernorm = _norm(src.input_layernorm)
        self.self_attn = _ShardAttention(src.self_attn, d, n)
        self.post_attention_layernorm = _norm(src.post_attention_layernorm)
        self.mlp = _ShardMLP(src.mlp, d, n)


class _ShardModel(nn.Module):
    def __init__(self, src, d: int, n: int, lo: int, hi: int):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _param(src.embed_tokens.weight[lo:hi])
        self.layers = nn.ModuleList(_ShardLayer(layer, d, n) for layer in src.layers)
        self.norm = _norm(src.norm)


class LlamaShard(nn.Module):
    """Device d's part, with the Llama's own parameter names (`model.layers.3.mlp.up_proj.weight`)."""

    def __init__(self, llama: Llama, d: int, n: int):
        super().__init__()
        vocab = llama.config.vocab_size
        per = -(-vocab // n)
        self.vocab_start, self.vocab_end = min(d * per, vocab), min((d + 1) * per, vocab)
        self.model = _ShardModel(llama.model, d, n, self.vocab_start, self.vocab_end)
        if llama.config.tie_embeddings:
            self.lm_head = nn.Module()
            self.lm_head.weight = self.model.embed_tokens.weight  # one tensor, as in the Llama
        else:
            self.lm_head = _linear(llama.lm_head.weight[self.vocab_start:self.vocab_end])

    def embed(self, tokens, dtype):
        """This device's rows of the embedding: the table's rows for ids in its range, zeros elsewhere."""
        rows = self.vocab_end - self.vocab_start
        local = tokens - self.vocab_start
        inside = (local >= 0) & (local < rows)
        gathered = F.embedding(local.clamp(0, max(rows - 1, 0)), self.model.embed_tokens.weight).to(dtype)
        return gathered * inside.unsqueeze(-1).to(dtype)

    def logits(self, h):
        return F.linear(self.model.norm(h), self.lm_head.weight)


class TensorParallelLlama(nn.Module):
    """A Llama split over `n` devices (module docstring). The weights are views of the Llama's where a
    device's part is contiguous (rows), so nothing is copied until the parameter archive is written."""

    def __init__(self, llama: Llama, n: int):
        super().__init__()
        check_split(llama.config, n)
        self.config, self.n = llama.config, n
        self.shards = nn.ModuleList(LlamaShard(llama, d, n) for d in range(n))
        self.register_buffer("rope_cos", llama.rope_cos, persistent=False)
        self.register_buffer("rope_sin", llama.rope_sin, persistent=False)
        self.dtype = llama.model.norm.weight.dtype

    @property
    def kv_heads_per_device(self) -> int:
        return self.config.n_kv_heads // self.n

    def to_all(self, x) -> list:
        """x (on device 0) on every device: [x, transfer(x, 1), ...]."""
        return [x] + [transfer(x, d) for d in range(1, self.n)]

    def all_reduce(self, parts: list) -> list:
        """Device t's copy of sum(parts), for every t: all N partials added in device order on each."""
        out = []
        for t in range(self.n):
            total = None
            for d, p in enumerate(parts):
                # The device's own term too: a transfer to where it already is (at most a copy of [S, dim]).
                # Added bare, IREE 3.13's aggressive fusion (on for fp8/bf16 weights) moved the sum into
                # the local term's dispatch region, ahead of the other device's transfer: "operand #1
                # does not dominate this use" (fp8 tiny Llama). Pinned with flow.tensor.barrier
                # instead, the 8B's prefill failed in stream partitioning: "circular dependency: input
                # operation uses partition output stream.async.barrier".
                p = transfer(p, t)
                total = p if total is None else total + p
            out.append(total)
        return out

    def gather_logits(self, parts: list):
        """The logits slices of every device, concatenated on device 0."""
        return torch.cat([transfer(p, 0) for p in parts], dim=-1)

    def layers(self, hs, cos, sin, cache, write_rows, attend, attend_last=None):
        """Run every layer on every device. hs: the residual's replica on each device; cos/sin/
        write_rows: per device; attend(d, q, k, v, kc, vc) -> attention output on device d (k, v: the
        new rows; kc, vc: the cache with them written); cache: flat, in
        cache_order. attend_last (the same signature): given, the last layer runs the last position
        alone past its K/V, attending with it (LlamaPrefill's one-row last layer). Returns (hs, new cache)."""
        n, out_cache = self.n, []
        for i in range(self.config.n_layers):
            one_row = attend_last is not None and i == self.config.n_layers - 1
            parts = []
            for d, shard in enumerate(self.shards):
                layer = shard.model.layers[i]
                q, k, v = layer.self_attn.qkv(layer.input_layernorm(hs[d]), cos[d], sin[d], last_position if one_row else None)
                j = 2 * (i * n + d)
                kc = cache[j].index_copy(2, write_rows[d], k)
                vc = cache[j + 1].index_copy(2, write_rows[d], v)
                out_cache += [kc, vc]
                parts.append(layer.self_attn.out((attend_last if one_row else attend)(d, q, k, v, kc, vc)))
            if one_row:
                hs = [last_position(h, 1) for h in hs]
            hs = [h + r for h, r in zip(hs, self.all_reduce(parts))]
            parts = [shard.model.layers[i].mlp(shard.model.layers[i].post_attention_layernorm(hs[d]))
                     for d, shard in enumerate(self.shards)]
            hs = [h + r for h, r in zip(hs, self.all_reduce(parts))]
        return hs, out_cache

    def embed(self, tokens):
        ids = self.to_all(tokens)
        return self.all_reduce([shard.embed(ids[d], self.dtype) for d, shard in enumerate(self.shards)])

    def rope(self, start, end):
        cos = self.rope_cos[start:end].to(self.dtype)
        sin = self.rope_sin[start:end].to(self.dtype)
        return self.to_all(cos), self.to_all(sin)


def cache_order(n_layers: int, n: int) -> list[tuple[int, int, str]]:
    """(layer, device, "k"|"v") of each cache tensor, in argument order: layer-major, then device."""
    return [(i, d, kv) for i in range(n_layers) for d in range(n) for kv in ("k", "v")]


def new_cache(config: LlamaConfig, n: int, max_seq_len: int, dtype=torch.float32) -> list[torch.Tensor]:
    """Zeroed sharded KV cache in cache_order: [1, n_kv_heads / n, max_seq_len, head_dim] each."""
    shape = (1, config.n_kv_heads // n, max_seq_len, config.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * config.n_layers * n)]


class TensorParallelPrefill(nn.Module):
    """LlamaPrefill's contract over the sharded cache: prefill(tokens[1, S], *cache) -> (logits of the
    last position [1, 1, vocab] on device 0, *cache')."""

    def __init__(self, tp: TensorParallelLlama):
        super().__init__()
        self.tp = tp

    def forward(self, tokens, *cache):
        tp = self.tp
        s = tokens.shape[1]
        hs = tp.embed(tokens)
        cos, sin = tp.rope(0, s)
        rows = tp.to_all(torch.arange(s))

        def attend(d, q, k, v, kc, vc):  # causal over the prompt's own rows, as LlamaPrefill
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        last_biases = tp.to_all(last_row_bias(s, tp.dtype))  # all zeros: model.py last_row_bias says why

        def attend_last(d, q, k, v, kc, vc):  # the last position's one query row sees every row
            return F.scaled_dot_product_attention(q, k, v, attn_mask=last_biases[d], enable_gqa=True)

        hs, out_cache = tp.layers(hs, cos, sin, cache, rows, attend, attend_last)
        logits = tp.gather_logits([shard.logits(hs[d]) for d, shard in enumerate(tp.shards)])
        return (logits, *out_cache)


class TensorParallelDecode(nn.Module):
    """LlamaDecode's contract over the sharded cache: decode(token[1, 1], attention_mask[1, L], *cache)
    -> (logits [1, 1, vocab] on device 0, *cache')."""

    def __init__(self, tp: TensorParallelLlama):
        super().__init__()
        self.tp = tp

    def forward(self, token, attention_mask, *cache):
        tp = self.tp
        n = attention_mask.shape[1]
        hs = tp.embed(token)
        cos, sin = tp.rope(n - 1, n)
        bias = additive_mask(attention_mask == 0, tp.dtype)
        biases = tp.to_all(bias[:, None, None, :])
        rows = tp.to_all(torch.arange(n - 1, n))

        def attend(d, q, k, v, kc, vc):
            keys = torch.ops.aten.slice_copy.Tensor(kc, 2, 0, n)
            values = torch.ops.aten.slice_copy.Tensor(vc, 2, 0, n)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=biases[d], enable_gqa=True)

        hs, out_cache = tp.layers(hs, cos, sin, cache, rows, attend)
        logits = tp.gather_logits([shard.logits(hs[d]) for d, shard in enumerate(tp.shards)])
        return (logits, *out_cache)
