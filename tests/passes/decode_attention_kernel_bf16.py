# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A decode step over bf16 caches (--kv-dtype bf16: llmc's Llama slices the cache, then widens the rows to
# f32 for attention), and the static decode's widened whole cache: each becomes one call of the bf16
# attention kernel on the *bf16* caches themselves, so no f32 copy of the cache is made. An f16 cache
# widened is not one the kernel reads: the f32 kernel takes the widened tensor (a copy, still right).
# Declined: a bf16 K beside an f32 V cache.
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim


class Attn(torch.nn.Module):
    def forward(self, q, kc, vc, mask, full_mask, hc, fc):
        n = mask.shape[3]
        k = torch.ops.aten.slice_copy.Tensor(kc, 2, 0, n).to(torch.float32)
        v = torch.ops.aten.slice_copy.Tensor(vc, 2, 0, n).to(torch.float32)
        step = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        static = F.scaled_dot_product_attention(q, kc.to(torch.float32), vc.to(torch.float32), attn_mask=full_mask, enable_gqa=True)
        half = F.scaled_dot_product_attention(q, hc.to(torch.float32), hc.to(torch.float32), attn_mask=full_mask, enable_gqa=True)
        mixed = F.scaled_dot_product_attention(q, kc.to(torch.float32), fc, attn_mask=full_mask, enable_gqa=True)
        return step, static, half, mixed


n = Dim("n", min=1, max=16)
args = (torch.randn(1, 4, 1, 8), torch.randn(1, 2, 16, 8, dtype=torch.bfloat16), torch.randn(1, 2, 16, 8, dtype=torch.bfloat16),
        torch.zeros(1, 1, 1, 5), torch.zeros(1, 1, 1, 16), torch.randn(1, 2, 16, 8, dtype=torch.float16), torch.randn(1, 2, 16, 8))
dyn = (None, None, None, {3: n}, None, None, None)
torch.export.save(torch.export.export(Attn(), args, dynamic_shapes=dyn), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.to.dtype %arg2,
# CHECK:       call @__llmc_attn_decode_bf16_4x2x16x8(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16>, tensor<1x1x1x?xf32>) -> tensor<1x4x1x8xf32>
# CHECK-NOT:   torch.aten.to.dtype %arg2,
# CHECK:       call @__llmc_attn_decode_bf16_4x2x16x8_L16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16>, tensor<1x1x1x16xf32>) -> tensor<1x4x1x8xf32>
# CHECK-NOT:   torch.aten.to.dtype %arg2,
# CHECK:       torch.aten.to.dtype %arg5, {{.*}} -> !torch.vtensor<[1,2,16,8],f32>
# CHECK:       call @__llmc_attn_decode_4x2x16x8_L16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xf32>, tensor<1x2x16x8xf32>
# CHECK:       flow.dispatch @__llmc_kernels::@attn_decode_bf16[%hk](%q, %k, %v, %b, %l, %hk, %g, %c, %d) : (tensor<1x4x1x8xf32>, tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16>
# CHECK:       stream.executable.export public @attn_decode_bf16
# CHECK:       func.func private @llmc_attn_decode_bf16(memref<?xf32>, memref<?xi16>, memref<?xi16>, memref<?xf32>, memref<?xf32>,
# CHECK:       %k = stream.binding.subspan %bk[%c0] : !stream.binding -> memref<?xi16>{%nk}

# STATS:       "name": "decode-attention-kernel"
# STATS:       "rewrote": 3
# STATS:       "declined": 1
# STATS:       "decline_reasons": [
# STATS-NEXT:  "caches torch.bfloat16 and torch.float32 (the kernel: both f32 or both bf16)"
