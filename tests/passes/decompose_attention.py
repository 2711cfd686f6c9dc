# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A decode step (one query row, GQA, a float mask over a dynamic cache length) gets the f32
# multiply + sum form; a prefill (causal, many rows, f32) gets the causal form: matmuls, and a
# softmax written with exp2 whose mask is applied in the max and again in the exponent.
# Both lines fail if decompose-attention leaves the cpu pipeline.
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim


class Attn(torch.nn.Module):
    def forward(self, q1, k, v, mask, q):
        decode = F.scaled_dot_product_attention(q1, k, v, attn_mask=mask, enable_gqa=True)
        prefill = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return decode, prefill


L = Dim("L", min=2, max=64)
args = (torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.zeros(1, 1, 1, 5), torch.randn(1, 2, 6, 8))
dyn = (None, {2: L}, {2: L}, {3: L}, None)
torch.export.save(torch.export.export(Attn(), args, dynamic_shapes=dyn), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   scaled_dot_product
# Decode: q [1,4,1,8] as [1,2,2,1,8] against k [1,2,1,L,8], reduced over D in f32.
# CHECK:       torch.aten.view %arg0, {{.*}} -> !torch.vtensor<[1,2,2,1,8],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}} -> !torch.vtensor<[1,2,2,?,8],f32>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,2,2,?],f32>
# CHECK:       torch.aten.exp {{.*}} -> !torch.vtensor<[1,2,2,?],f32>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,2,2,8],f32>
# CHECK-NOT:   torch.aten.bmm {{.*}}[1,2,2
# Prefill: the causal form.
# CHECK:       torch.aten.bmm
# CHECK:       torch.aten.gt.Tensor
# CHECK:       torch.aten.where.self
# CHECK:       torch.aten.max.dim
# CHECK:       torch.aten.where.self
# CHECK:       torch.aten.pow.Scalar
# CHECK-NOT:   torch.aten.softmax
# CHECK-NOT:   torch.aten._softmax
# CHECK:       torch.aten.bmm
# CHECK-NOT:   scaled_dot_product

# STATS:       "name": "decompose-attention"
# STATS:       "rewrote": 2
# STATS:       "causal": 1
# STATS-NEXT:  "decode": 1
