# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target hip | filecheck %s --check-prefix=GPU
# Attention the chunk kernel does not compute stays with decompose-attention: a head size that is not a
# multiple of 16 (8), one query row (a decode step: decode-attention-kernel's), a causal call (the dynamic
# prefill), keys that are not the first rows of a cache (a slice from row 1), a mask of one row for every
# query row, bf16 q/k/v, and caches of batch 2 under q of batch 1. GPU targets keep SDPA whole.
import sys

import torch
import torch.nn.functional as F


class Attn(torch.nn.Module):
    def forward(self, q8, k8, q, kc, vc, q1, keep, row, kb2):
        return (F.scaled_dot_product_attention(q8, k8, k8, attn_mask=keep),
                F.scaled_dot_product_attention(q1, kc, vc, attn_mask=keep[:, :, :1]),
                F.scaled_dot_product_attention(q, kc, vc, is_causal=True),
                F.scaled_dot_product_attention(q, kc[:, :, 1:], vc[:, :, 1:], attn_mask=keep[..., 1:]),
                F.scaled_dot_product_attention(q, kc, vc, attn_mask=row),
                F.scaled_dot_product_attention(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), attn_mask=keep),
                F.scaled_dot_product_attention(q, kb2, kb2, attn_mask=keep))


args = (torch.randn(1, 2, 3, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16),
        torch.randn(1, 2, 1, 16), torch.ones(1, 1, 3, 6, dtype=torch.bool), torch.zeros(1, 1, 1, 6), torch.randn(2, 2, 6, 16))
torch.export.save(torch.export.export(Attn(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   llmc_attn_chunk
# CHECK-NOT:   scaled_dot_product
# CHECK:       return

# STATS:       "name": "chunk-attention-kernel"
# STATS:       "rewrote": 0
# STATS:       "declined": 7
# STATS:       "decline_reasons": [
# STATS-DAG:   "2 query heads on 2, head size 8 (the kernel: up to 8 per KV head, a head size that is a multiple of 16, 8 x heads per KV head x head size <= 4096)"
# STATS-DAG:   "not a static block of query rows of batch 1"
# STATS-DAG:   "dropout or causal"
# STATS-DAG:   "k/v not the first rows of a cache"
# STATS-DAG:   "mask not [1, 1, C, L] over the rows attended"
# STATS-DAG:   "not f32"
# STATS-DAG:   "cache shapes"

# GPU-LABEL:   func.func @main
# GPU-NOT:     llmc_attn_chunk
# GPU:         torch.aten.scaled_dot_product_attention
