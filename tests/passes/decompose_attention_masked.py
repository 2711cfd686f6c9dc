# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A prefill chunk's attention (LlamaPrefillChunk: a few query rows against a dynamic-length cache,
# GQA, f32, a bool mask [1, 1, S, L]) gets the masked form: the causal form's matmuls and exp2
# softmax with the bool mask applied in the max and again in the exponent, and the row sum clamped
# away from 0 (a row that keeps no key gives 0, as PyTorch's math SDPA does). No softmax op is left.
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim


class Chunk(torch.nn.Module):
    def forward(self, q, k, v, mask):
        n = k.shape[2]
        keep = (torch.arange(n).unsqueeze(0) <= torch.arange(n - 3, n).unsqueeze(1)) & (mask != 0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[None, None], enable_gqa=True)


L = Dim("L", min=3, max=64)
args = (torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.ones(1, 5, dtype=torch.int64))
dyn = (None, {2: L}, {2: L}, {1: L})
torch.export.save(torch.export.export(Chunk(), args, dynamic_shapes=dyn), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   scaled_dot_product
# q's 4 heads folded into rows of its 2 KV heads: [1,2,6,8] against k^T.
# CHECK:       torch.aten.bmm {{.*}} -> !torch.vtensor<[2,6,?],f32>
# CHECK:       torch.aten.logical_not
# CHECK:       torch.aten.where.self
# CHECK:       torch.aten.max.dim
# CHECK:       torch.aten.where.self
# CHECK:       torch.aten.pow.Scalar
# CHECK:       torch.aten.clamp
# CHECK:       torch.aten.div.Tensor
# CHECK-NOT:   torch.aten.softmax
# CHECK-NOT:   torch.aten._softmax
# CHECK:       torch.aten.bmm
# CHECK-NOT:   scaled_dot_product

# STATS:       "name": "decompose-attention"
# STATS:       "rewrote": 1
# STATS:       "masked": 1
