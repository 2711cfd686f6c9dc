# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 | filecheck %s --check-prefix=OFF
# A prefill chunk's attention (3 query rows, 4 query heads on 2 KV heads, D = 16) over the first n rows of
# 16-row f32 caches (llmc's LlamaPrefillChunk: slice_copy of the cache) with the chunk's bool mask, in two
# layers that share the mask, and once with an additive f32 mask and the call's own scale: each becomes one
# call of llmc's chunk attention kernel with q scaled and the *whole* caches; the bool mask becomes one f32
# bias of 0 / -inf for both layers. With the kernels off the calls keep decompose-attention's masked form.
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim


class Chunk(torch.nn.Module):
    def forward(self, q, kc, vc, k2, v2, mask, bias):
        n = mask.shape[1]
        rows = torch.arange(n - 3, n)
        keep = ((torch.arange(n).unsqueeze(0) <= rows.unsqueeze(1)) & (mask != 0))[None, None]
        k = torch.ops.aten.slice_copy.Tensor(kc, 2, 0, n)
        v = torch.ops.aten.slice_copy.Tensor(vc, 2, 0, n)
        one = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
        k = torch.ops.aten.slice_copy.Tensor(k2, 2, 0, n)
        v = torch.ops.aten.slice_copy.Tensor(v2, 2, 0, n)
        two = F.scaled_dot_product_attention(one, k, v, attn_mask=keep, enable_gqa=True)
        k = torch.ops.aten.slice_copy.Tensor(kc, 2, 0, n)
        v = torch.ops.aten.slice_copy.Tensor(vc, 2, 0, n)
        three = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True, scale=0.5)
        return two, three


n = Dim("n", min=3, max=16)
args = (torch.randn(1, 4, 3, 16), *(torch.randn(1, 2, 16, 16) for _ in range(4)), torch.ones(1, 5, dtype=torch.int64),
        torch.zeros(1, 1, 3, 5))
dyn = (None, None, None, None, None, {1: n}, {3: n})
torch.export.save(torch.export.export(Chunk(), args, dynamic_shapes=dyn), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   scaled_dot_product
# CHECK:       %[[BIAS:.*]] = torch.aten.where.self {{.*}} -> !torch.vtensor<[1,1,3,?],f32>
# CHECK-NOT:   torch.aten.where
# CHECK:       torch.aten.mul.Scalar %arg0, %float2.500000e-01
# CHECK:       "torch_c.to_builtin_tensor"(%[[BIAS]])
# CHECK:       call @__llmc_attn_chunk_4x2x3x16x16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x3x16xf32>, tensor<1x2x16x16xf32>, tensor<1x2x16x16xf32>, tensor<1x1x3x?xf32>) -> tensor<1x4x3x16xf32>
# CHECK-NOT:   torch.aten.where
# CHECK:       "torch_c.to_builtin_tensor"(%[[BIAS]])
# CHECK:       call @__llmc_attn_chunk_4x2x3x16x16(
# CHECK:       torch.aten.mul.Scalar %arg0, %float5.000000e-01
# CHECK:       call @__llmc_attn_chunk_4x2x3x16x16(
# CHECK-NOT:   torch.aten.exp
# CHECK:       %l = tensor.dim %b, %c3 : tensor<1x1x3x?xf32>
# CHECK:       flow.dispatch @__llmc_kernels::@attn_chunk[%n](%q, %k, %v, %b, %l, %hk, %g, %c, %cm, %d, %np)
# CHECK:       func.call @llmc_attn_chunk(

# STATS:       "name": "chunk-attention-kernel"
# STATS:       "rewrote": 3

# OFF-LABEL:   func.func @main
# OFF-NOT:     llmc_attn_chunk
# OFF:         torch.aten.bmm
