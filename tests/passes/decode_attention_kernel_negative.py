# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target hip | filecheck %s --check-prefix=GPU
# Attention the kernel does not compute stays with decompose-attention: a head size that is not a
# multiple of 8 (12), several query rows (a prefill), a causal one-row call, no mask, keys that are not
# the first rows of a cache (a slice from row 1), a bool mask, and caches of batch 2 under q of batch 1.
# GPU targets keep SDPA whole.
import sys

import torch
import torch.nn.functional as F


class Attn(torch.nn.Module):
    def forward(self, q12, k12, q, kc, vc, q3, mask, keep, kb2):
        return (F.scaled_dot_product_attention(q12, k12, k12, attn_mask=mask),
                F.scaled_dot_product_attention(q3, kc, vc, attn_mask=mask),
                F.scaled_dot_product_attention(q, kc, vc, is_causal=True),
                F.scaled_dot_product_attention(q, kc, vc),
                F.scaled_dot_product_attention(q, kc[:, :, 1:], vc[:, :, 1:], attn_mask=mask[..., 1:]),
                F.scaled_dot_product_attention(q, kc, vc, attn_mask=keep),
                F.scaled_dot_product_attention(q, kb2, kb2, attn_mask=mask))


args = (torch.randn(1, 2, 1, 12), torch.randn(1, 2, 6, 12), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8),
        torch.randn(1, 2, 3, 8), torch.zeros(1, 1, 1, 6), torch.ones(1, 1, 1, 6, dtype=torch.bool), torch.randn(2, 2, 6, 8))
torch.export.save(torch.export.export(Attn(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   llmc_attn_decode
# CHECK-NOT:   scaled_dot_product
# CHECK:       return

# STATS:       "name": "decode-attention-kernel"
# STATS:       "rewrote": 0
# STATS:       "declined": 7
# STATS:       "decline_reasons": [
# STATS-DAG:   "2 query heads on 2, head size 12 (the kernel: a multiple of 8 up to 256, up to 8 per KV head)"
# STATS-DAG:   "not one query row of batch 1"
# STATS-DAG:   "dropout or causal"
# STATS-DAG:   "no additive f32 mask"
# STATS-DAG:   "k/v not the first rows of a cache"
# STATS-DAG:   "not f32"
# STATS-DAG:   "cache shapes"

# GPU-LABEL:   func.func @main
# GPU-NOT:     llmc_attn_decode
# GPU:         torch.aten.scaled_dot_product_attention
