# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 | filecheck %s --check-prefix=OFF
# A decode step's attention (one query row, 4 query heads on 2 KV heads, D = 8) over the first n rows of
# a 16-row f32 cache with an additive mask (llmc's Llama decode: slice_copy of the cache), and over the
# whole cache (the static decode), each becomes one call of llmc's attention kernel with q scaled by
# D^-0.5 (and by the call's own scale: 0.5) and the *whole* caches: the kernel reads the first L rows,
# L from the mask. With the kernels off the calls keep decompose-attention's decode form.
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim


class Attn(torch.nn.Module):
    def forward(self, q, kc, vc, mask, full_mask):
        n = mask.shape[3]
        k = torch.ops.aten.slice_copy.Tensor(kc, 2, 0, n)
        v = torch.ops.aten.slice_copy.Tensor(vc, 2, 0, n)
        step = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        static = F.scaled_dot_product_attention(q, kc, vc, attn_mask=full_mask, enable_gqa=True, scale=0.5)
        return step, static


n = Dim("n", min=1, max=16)
args = (torch.randn(1, 4, 1, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8), torch.zeros(1, 1, 1, 5), torch.zeros(1, 1, 1, 16))
dyn = (None, None, None, {3: n}, None)
torch.export.save(torch.export.export(Attn(), args, dynamic_shapes=dyn), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   scaled_dot_product
# CHECK:       torch.aten.mul.Scalar %arg0, %float3.535530e-01
# CHECK:       call @__llmc_attn_decode_4x2x16x8(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xf32>, tensor<1x2x16x8xf32>, tensor<1x1x1x?xf32>) -> tensor<1x4x1x8xf32>
# CHECK:       torch.aten.mul.Scalar %arg0, %float5.000000e-01
# CHECK:       call @__llmc_attn_decode_4x2x16x8_L16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xf32>, tensor<1x2x16x8xf32>, tensor<1x1x1x16xf32>) -> tensor<1x4x1x8xf32>
# CHECK-NOT:   torch.aten.exp
# CHECK-NOT:   torch.aten.softmax
# CHECK:       %l = tensor.dim %b, %c3 : tensor<1x1x1x?xf32>
# CHECK:       flow.dispatch @__llmc_kernels::@attn_decode[%hk](%q, %k, %v, %b, %l, %hk, %g, %c, %d)
# CHECK:       %l = arith.constant 16 : index
# CHECK:       func.call @llmc_attn_decode(

# STATS:       "name": "decode-attention-kernel"
# STATS:       "rewrote": 2

# OFF-LABEL:   func.func @main
# OFF-NOT:     llmc_attn_decode
# OFF:         torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,2,2,?],f32>
# OFF-NOT:     llmc_attn_decode
