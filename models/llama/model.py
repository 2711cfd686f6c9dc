"""An export-friendly Llama: one definition for eager reference, prefill and decode with a KV cache.

Parameter names are exactly Hugging Face `LlamaForCausalLM`'s (`model.layers.3.self_attn.q_proj.weight`,
...), so an HF state dict loads as it is and the Meta loader converts to these names (and to the
rotate-half rotary layout) once. The math follows the reference implementations step for step
(RMSNorm in f32 then cast back, cos/sin computed in f32 and cast to the activation dtype, SwiGLU),
because the acceptance tests compare greedy tokens with `transformers` eager.

Entry points for generation (`LlamaPrefill`, `LlamaDecode`) take the KV cache as explicit tensors
and return the updated cache (docs/architecture.md: the tied functional form): one cache tensor per layer for
K and one for V, `[1, n_kv_heads, max_seq_len, head_dim]`. The compiler marks each returned cache
as tied to its input (`iree.abi.tied`), so IREE writes the new rows into the caller's buffer in place
and never copies the cache. The cache may be narrower than the math (`--kv-dtype bf16` under f32): K/V
rows are rounded to its dtype as they are written (`stored`) and widened back where attention reads
them (`read`); a prefill attends over its own unrounded rows, later calls over the stored ones, so
eager with the same cache dtype is the reference (llmc diff builds it so).

Decode attends only to the live prefix of the cache, not all of it: the number of live positions L
arrives as the length of `attention_mask` ([1, L], ones), a dynamic dimension, so the attention
work of a step is proportional to L and not to max_seq_len (the same trick as sharktank's
`seq_block_ids`, whose dynamic length carries the page count).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from llmc.models.llama.config import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Rotary inverse frequencies, with Llama-3.1's frequency-dependent scaling when configured.

    Llama 3.1 leaves high frequencies (wavelength shorter than original_context / high_freq_factor)
    alone, divides low frequencies (wavelength longer than original_context / low_freq_factor) by
    `factor`, and interpolates linearly in between.
    """
    hd = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
    s = config.rope_scaling
    if s is None:
        return inv
    factor, lo, hi, orig = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = orig / lo, orig / hi
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    t = (orig / wavelen - lo) / (hi - lo)
    blended = (1 - t) * scaled / factor + t * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(medium, blended, scaled)


def rope_tables(config: LlamaConfig, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [n_positions, head_dim] in f32, rotate-half layout (frequencies repeated twice)."""
    inv = rope_inv_freq(config)
    pos = torch.arange(n_positions, dtype=torch.int64).to(torch.float32)
    freqs = pos[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, S, D]; cos/sin: [S, D] already in x's dtype."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        c = config
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def qkv(self, x, cos, sin, query_rows=None):
        """q, k, v [B, H, S, D] with RoPE. `query_rows` (a function taking a tensor and the dim of its
        positions) keeps only those positions' queries: k and v are still made for every row."""
        b, s, _ = x.shape
        xq, cq, sq = (x, cos, sin) if query_rows is None else (query_rows(x, 1), query_rows(cos, 0), query_rows(sin, 0))
        q = self.q_proj(xq).view(b, xq.shape[1], self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cq, sq), apply_rope(k, cos, sin), v

    def out(self, o):
        # [B, H, S, D] -> [B, S, H*D]: the transpose(1,2).flatten(2,3) -> linear pattern.
        return self.o_proj(o.transpose(1, 2).flatten(2, 3))

    def forward(self, x, cos, sin):
        q, k, v = self.qkv(x, cos, sin)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)


class Llama(nn.Module):
    """Llama for causal LM. `forward(tokens[B, S]) -> logits[B, S, vocab]` (no cache: the reference).

    `rope_positions` sizes the cos/sin tables (non-persistent buffers): the longest sequence this
    instance will see, which for a compiled module is its --max-seq-len.
    """

    def __init__(self, config: LlamaConfig, rope_positions: int | None = None):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.set_rope_positions(rope_positions or min(config.max_seq_len, 4096))

    def set_rope_positions(self, n: int) -> None:
        with torch.device("cpu"):
            cos, sin = rope_tables(self.config, n)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def from_state_dict(cls, config: LlamaConfig, state_dict: dict, rope_positions: int | None = None) -> "Llama":
        """Build around the given tensors without copying them (they may be memory-mapped)."""
        with torch.device("meta"):
            m = cls(config, rope_positions=1)
        sd = dict(state_dict)
        if config.tie_embeddings:
            sd.pop("lm_head.weight", None)
        missing, unexpected = m.load_state_dict(sd, strict=False, assign=True)
        missing = [k for k in missing if not (config.tie_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            from llmc.errors import InputError

            raise InputError(f"state dict does not fit {config.name}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        if config.tie_embeddings:
            m.lm_head.weight = m.model.embed_tokens.weight
        m.set_rope_positions(rope_positions or min(config.max_seq_len, 4096))
        return m.eval()

    # An export may keep the embedding table narrower than the activations (a bf16 checkpoint's table
    # under f32 math, export.convert_module): gathered rows are cast to the norms' dtype, which is
    # the model's compute dtype. A no-op where the two agree.
    casts_embedding_rows = True

    def embed(self, tokens):
        return self.model.embed_tokens(tokens).to(self.model.norm.weight.dtype)

    def rope(self, start, end, dtype):
        return self.rope_cos[start:end].to(dtype), self.rope_sin[start:end].to(dtype)

    def forward(self, tokens):
        h = self.embed(tokens)
        cos, sin = self.rope(0, tokens.shape[1], h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.model.norm(h))


def init_random(config: LlamaConfig, seed: int = 0, dtype=torch.float32, rope_positions: int | None = None) -> Llama:
    """A Llama with seeded random weights: linear/embedding std 1/sqrt(fan_in), norms 1 + 0.1 N(0,1).

    The scale keeps activations O(1) through the layers, so logits are well separated and greedy
    decoding is not decided by rounding noise.
    """
    g = torch.Generator().manual_seed(seed)
    m = Llama(config, rope_positions=rope_positions)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return m.to(dtype).eval()


def stored(x, cache):
    """K or V rows as the cache stores them: in its dtype (rounded to nearest even when the cache is
    narrower than the compute dtype: --kv-dtype bf16); x itself when the dtypes agree (no op exported)."""
    return x if x.dtype == cache.dtype else x.to(cache.dtype)


def read(rows, like):
    """Cache rows widened to the compute dtype of `like` for attention (exact: bf16 -> f32)."""
    return rows if rows.dtype == like.dtype else rows.to(like.dtype)


def new_cache(config: LlamaConfig, max_seq_len: int, dtype=torch.float32) -> list[torch.Tensor]:
    """Zeroed KV cache: [k0, v0, k1, v1, ...], each [1, n_kv_heads, max_seq_len, head_dim]."""
    shape = (1, config.n_kv_heads, max_seq_len, config.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * config.n_layers)]


def head_logits(m: "Llama", h):
    """The LM head's logits in f32 whatever the compute dtype: the device widens them (one elementwise
    pass over the vocabulary) rather than the host, where numpy's astype took
    60 µs for 32000 f16 logits and 306 µs for Llama 3's 128256 (this project's AMD EPYC) on every
    generate step, against a 1.6-3.3 ms GPU decode step."""
    return m.lm_head(m.model.norm(h)).float()


def additive_mask(masked, dtype):
    """An attention bias of `masked`'s shape: 0 where a key is seen, -inf where `masked` is True."""
    return torch.zeros(masked.shape, dtype=dtype).masked_fill(masked, float("-inf"))


def last_row_bias(s, dtype):
    """The attention bias [1, 1, 1, s] of a prefill's last position: all zeros (it sees every key).

    Given rather than no mask: IREE 3.13's GPU pipelines pad a one-query-row attention whose key
    length is dynamic, cannot without a mask ("Padding OnlineAttention without existing mask is not
    yet supported") and fall back to a form whose codegen took 261 s of a 275 s tiny-Llama build for
    hip gfx1201 (8 s with this mask; this project's EPYC). Built from the length (positions past
    s - 1), not from a constant, so no folding takes it away again."""
    return additive_mask(torch.arange(s) > s - 1, dtype)[None, None, None, :]


def last_position(t, dim):
    """The last position of `t` along `dim`, kept as a length-1 dim."""
    return t.narrow(dim, t.shape[dim] - 1, 1)


class LlamaPrefill(nn.Module):
    """prefill(tokens[1, S], *cache) -> (logits of the last position [1, 1, vocab], *cache').

    Writes K/V of positions 0..S-1 into the cache and attends causally over the S new tokens. Only
    the last position goes through the LM head (docs/architecture.md: -21% prefill time, and no
    S x vocab output), and so only it goes through the last layer past its K/V: that layer makes K
    and V of every position (the cache needs them) but its query, attention, output projection and
    MLP for the last position alone, which is all the logits read (the other positions' outputs of
    the last layer feed nothing). llama.cpp skips the same rows. For small-125m that is 7.8% of a
    prefill's FLOPs (docs/targets.md, "The last layer's unread rows"). `whole_last_layer=True` runs
    that layer over every position, as a standard forward (eager PyTorch, transformers) does: the
    benchmark's eager reference.
    """

    def __init__(self, llama: Llama, whole_last_layer: bool = False):
        super().__init__()
        self.llama = llama
        self.whole_last_layer = whole_last_layer

    def forward(self, tokens, *cache):
        bias = last_row_bias(tokens.shape[1], self.llama.model.norm.weight.dtype)
        h, out_cache = self.layers(tokens, cache, last_position, bias)
        logits = head_logits(self.llama, h)
        return (logits, *out_cache)

    def layers(self, tokens, cache, pick, pick_bias):
        """The hidden state after the last layer of the one position `pick(t, dim)` selects, and the cache
        with every position's K/V written. `pick_bias`: the additive mask [1, 1, 1, S] of that position's
        attention in the last layer."""
        m = self.llama
        s = tokens.shape[1]
        h = m.embed(tokens)
        cos, sin = m.rope(0, s, h.dtype)
        # index_copy (a scatter IREE performs in place), not slice_scatter: torch-mlir 20261001 leaves
        # aten.slice_scatter with a dynamic end unlowered and iree-compile rejects it.
        rows = torch.arange(s)
        out_cache = []
        last = len(m.model.layers) - 1
        for i, layer in enumerate(m.model.layers):
            attn = layer.self_attn
            one_row = i == last and not self.whole_last_layer
            q, k, v = attn.qkv(layer.input_layernorm(h), cos, sin, pick if one_row else None)
            out_cache.append(cache[2 * i].index_copy(2, rows, stored(k, cache[2 * i])))
            out_cache.append(cache[2 * i + 1].index_copy(2, rows, stored(v, cache[2 * i + 1])))
            if one_row:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=pick_bias, enable_gqa=True)
                h = pick(h, 1)
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            h = h + attn.out(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return (pick(h, 1) if self.whole_last_layer else h), out_cache


class LlamaPrefillBucket(LlamaPrefill):
    """prefill over a fixed number of positions: tokens[1, N] (the prompt, then any padding),
    length[1] (how many are the prompt), *cache -> (logits of position length - 1 [1, 1, vocab], *cache').

    Exported with N fixed, so every matmul has a static M (a dynamic M made IREE's CUDA matmuls ~40x
    slower: docs/targets.md). Padding is safe at the end only: attention is causal, so no prompt
    position sees a pad, and the pads' K/V land in cache positions >= length, which decode overwrites
    (it writes position L - 1 before it reads positions < L) before anything reads them. The last
    layer runs position length - 1 alone past its K/V (LlamaPrefill), its attention masked to the
    positions before it.
    """

    def forward(self, tokens, length, *cache):
        n = tokens.shape[1]
        bias = additive_mask(torch.arange(n) >= length, self.llama.model.norm.weight.dtype)
        h, out_cache = self.layers(tokens, cache, lambda t, dim: t.index_select(dim, length - 1), bias[None, None, None, :])
        logits = head_logits(self.llama, h)
        return (logits, *out_cache)


class LlamaPrefillChunk(nn.Module):
    """prefill_chunk(tokens[1, C], attention_mask[1, L], *cache) -> (logits of the chunk's last position
    [1, 1, vocab], *cache').

    C new tokens at positions L - C .. L - 1 after L - C positions already in the cache (an earlier
    prefill or chunk): their K/V are written at those rows, then each attends over cache rows 0..its
    own position (and where attention_mask is 1). Decode is the case C = 1. Exported with C fixed and
    L dynamic, so every matmul has a static M like a bucket's, while a prompt of any length runs as
    whole chunks with no padding: generate() prefills the first P mod C tokens with the dynamic prefill
    and the rest C at a time (docs/targets.md "Prefill chunks and prefill kernels": 1.07-1.10x the
    dynamic prefill in f32, and bf16/fp8/int8 weights read in llmc's many-row C kernel).
    """

    def __init__(self, llama: Llama):
        super().__init__()
        self.llama = llama

    def forward(self, tokens, attention_mask, *cache):
        m = self.llama
        c, n = tokens.shape[1], attention_mask.shape[1]
        h = m.embed(tokens)
        cos, sin = m.rope(n - c, n, h.dtype)
        rows = torch.arange(n - c, n)
        # query i (position n - c + i) sees keys 0..n - c + i: causal, aligned to the cache's end
        keep = (torch.arange(n).unsqueeze(0) <= rows.unsqueeze(1)) & (attention_mask != 0)
        # decode's layers with C rows (slice_copy: see LlamaDecode); the bool mask [1, 1, C, L] in place of its bias
        logits, out_cache = decode_layers(m, h, cos, sin, keep[None, None], rows, cache,
                                          lambda t: torch.ops.aten.slice_copy.Tensor(t, 2, 0, n))
        return (logits, *out_cache)


class LlamaDecode(nn.Module):
    """decode(token[1, 1], attention_mask[1, L], *cache) -> (logits [1, 1, vocab], *cache').

    The token sits at position L - 1; the cache holds positions 0..L-2 from earlier calls. K/V of the
    token are written at L - 1, then attention runs over cache[:, :, :L] with `attention_mask` (1 =
    attend, 0 = masked) as an additive mask.
    """

    def __init__(self, llama: Llama):
        super().__init__()
        self.llama = llama

    def forward(self, token, attention_mask, *cache):
        m = self.llama
        n = attention_mask.shape[1]
        h = m.embed(token)
        cos, sin = m.rope(n - 1, n, h.dtype)
        bias = additive_mask(attention_mask == 0, h.dtype)
        bias = bias[:, None, None, :]
        row = torch.arange(n - 1, n)
        # slice_copy, not kc[:, :, :n]: a plain slice makes torch.export guard n != max_seq_len (it
        # special-cases a full-length slice), which rejects the last cache position. In IREE both are
        # the same tensor.extract_slice, fused into the attention's consumers (no copy).
        logits, out_cache = decode_layers(m, h, cos, sin, bias, row, cache, lambda c: torch.ops.aten.slice_copy.Tensor(c, 2, 0, n))
        return (logits, *out_cache)


def decode_layers(m: "Llama", h, cos, sin, bias, row, cache, visible):
    """New tokens (one for a decode step, C for a prefill chunk) through every layer: K/V written at cache
    rows `row`, attention over `visible(cache)` with the mask `bias` (additive, or bool: True = attend);
    returns (the last position's logits, the cache). With C > 1 the last layer runs the last position
    alone past its K/V (as LlamaPrefill), attending with bias's last row in decode's additive form
    ([1, 1, 1, L]: the cpu decode attention kernel takes it; and never without a mask, model.py
    last_row_bias says why). Plain
    SDPA: GPU targets fuse it; on llvm-cpu the decompose-attention pass writes one-query-row attention
    as f32 multiply + sum without expanding the cache, and a chunk's bool-masked rows in its "masked"
    form (passes/decompose_attention.py)."""
    out_cache = []
    last = len(m.model.layers) - 1
    for i, layer in enumerate(m.model.layers):
        attn = layer.self_attn
        one_row = i == last and h.shape[1] > 1
        q, k, v = attn.qkv(layer.input_layernorm(h), cos, sin, last_position if one_row else None)
        kc = cache[2 * i].index_copy(2, row, stored(k, cache[2 * i]))
        vc = cache[2 * i + 1].index_copy(2, row, stored(v, cache[2 * i + 1]))
        out_cache += [kc, vc]
        mask = bias
        if one_row:
            h, mask = last_position(h, 1), last_position(bias, 2)
            if mask.dtype == torch.bool:
                mask = additive_mask(~mask, h.dtype)
        o = F.scaled_dot_product_attention(q, read(visible(kc), q), read(visible(vc), q), attn_mask=mask, enable_gqa=True)
        h = h + attn.out(o)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return head_logits(m, h), out_cache


class LlamaDecodeStatic(nn.Module):
    """decode_static(token[1, 1], position[1], *cache) -> (logits [1, 1, vocab], *cache').

    The same step as LlamaDecode with every shape fixed: the token's position comes as a tensor, and
    attention runs over the whole cache with the rows after `position` masked (they hold zeros or a
    bucket prefill's pads). No mask input: generate never masks a position before the token, and
    each input is one more host-to-device copy a step. A step then has no dynamic size, so IREE
    records its command buffer once and replays it (memoization, on by default in IREE 3.13): on an
    H200 a 125M model's step ran 1.2-1.4x faster than the dynamic one, a 1B's no faster
    (docs/targets.md). The price: attention reads all max_seq_len cache rows rather than position + 1.
    """

    def __init__(self, llama: Llama):
        super().__init__()
        self.llama = llama

    def forward(self, token, position, *cache):
        m = self.llama
        h = m.embed(token)
        cos = m.rope_cos.index_select(0, position).to(h.dtype)
        sin = m.rope_sin.index_select(0, position).to(h.dtype)
        rows = torch.arange(cache[0].shape[2])
        bias = additive_mask(rows > position, h.dtype)[None, None, None, :]
        logits, out_cache = decode_layers(m, h, cos, sin, bias, position, cache, lambda c: c)
        return (logits, *out_cache)
