"""Small seeded models that exercise the compile path: the op set of a Llama-class model, piece by piece.

Each builder returns (module, example_args, dynamic_shapes) with weights from a fixed seed, so tests,
the demo and benchmarks all compile the same thing. Nothing is downloaded.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearStack(nn.Module):
    def __init__(self, dims=(64, 96, 48, 32)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class SwiGLU(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim=64, hidden=160):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class RMSNorm(nn.Module):
    def __init__(self, dim=64, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(head_dim: int, max_pos: int, theta: float = 10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    """Llama attention: RoPE, grouped-query attention, causal SDPA, transpose(1,2).flatten(2,3) -> o_proj."""

    def __init__(self, dim=64, n_heads=4, n_kv_heads=2, max_pos=256, theta=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        cos, sin = rope_tables(self.head_dim, max_pos, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).flatten(2, 3))


class DecoderLayer(nn.Module):
    def __init__(self, dim=64, n_heads=4, n_kv_heads=2, hidden=160, max_pos=256):
        super().__init__()
        self.input_norm = RMSNorm(dim)
        self.attn = Attention(dim, n_heads, n_kv_heads, max_pos)
        self.post_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class TinyLlama(nn.Module):
    """A Llama-shaped causal LM (token ids -> logits) for the demo and the end-to-end tests."""

    def __init__(self, vocab=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden=160, max_pos=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, n_heads, n_kv_heads, hidden, max_pos) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _init(module: nn.Module, seed: int) -> nn.Module:
    """Deterministic, well-scaled weights (norm weights away from 1 so a wrong norm shows up)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        for name, b in module.named_buffers():
            if "running_var" in name:
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif "running_mean" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return module.eval()


def _seq(max_=128):
    return torch.export.Dim("seq", min=2, max=max_)


def build(name: str, seed: int = 0):
    """(module, example_args, dynamic_shapes) for one of ZOO's names."""
    g = torch.Generator().manual_seed(seed + 1)
    if name == "linear_stack":
        return _init(LinearStack(), seed), (torch.randn(2, 8, 64, generator=g),), None
    if name == "mlp_silu":
        return _init(SwiGLU(), seed), (torch.randn(1, 8, 64, generator=g),), None
    if name == "cnn":
        return _init(SmallCNN(), seed), (torch.randn(2, 3, 16, 16, generator=g),), None
    if name == "rmsnorm":
        return _init(RMSNorm(), seed), (torch.randn(1, 8, 64, generator=g),), None
    if name == "attention":
        return _init(Attention(), seed), (torch.randn(1, 8, 64, generator=g),), ({1: _seq()},)
    if name == "embedding":
        return _init(nn.Embedding(256, 64), seed), (torch.randint(0, 256, (1, 8), generator=g),), None
    if name == "tiny_llama":
        return _init(TinyLlama(), seed), (torch.randint(0, 256, (1, 8), generator=g),), ({1: _seq()},)
    raise KeyError(f"unknown zoo model {name!r}; choose one of {', '.join(ZOO)}")


ZOO = ("linear_stack", "mlp_silu", "cnn", "rmsnorm", "attention", "embedding", "tiny_llama")
