# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --dtype f16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# On SPIR-V in f16 both calls (a GQA decode step with a float mask over a dynamic cache length, and a
# causal prefill) get the half-matmul form: f16 matmuls, softmax in f32, and no f16 -> f32
# conversion of q, k or v before a contraction (IREE 3.13 clones such a conversion, with RoPE's
# gather behind it, into the matmul's dispatch and then fails on subgroup-8 targets).
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
# Decode: the 4 query heads fold into rows of the 2 KV heads; q k^T in f16.
# CHECK:       torch.aten.bmm {{.*}} : !torch.vtensor<[2,2,8],f16>, !torch.vtensor<[2,8,?],f16> -> !torch.vtensor<[2,2,?],f16>
# CHECK:       torch.aten.exp {{.*}} -> !torch.vtensor<[1,2,2,1,?],f32>
# CHECK:       torch.aten.bmm {{.*}} : !torch.vtensor<[2,2,?],f16>, !torch.vtensor<[2,?,8],f16> -> !torch.vtensor<[2,2,8],f16>
# Prefill: the same form, causal mask applied to f32 scores.
# CHECK:       torch.aten.bmm {{.*}} -> !torch.vtensor<[2,6,6],f16>
# CHECK:       torch.aten.exp {{.*}} -> !torch.vtensor<[1,2,1,6,6],f32>
# CHECK:       torch.aten.bmm {{.*}} -> !torch.vtensor<[2,6,8],f16>
# CHECK-NOT:   scaled_dot_product

# STATS:       "name": "decompose-attention"
# STATS:       "rewrote": 2
# STATS:       "half-matmul": 2
