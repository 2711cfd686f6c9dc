# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# fp8 scaled products (torch-mlir has no _scaled_mm lowering) become: operands widened to f32, an f32
# mm, the scales multiplied in, the bias added, one cast to out_dtype. Per-tensor E5M2 to bf16 and
# per-row/column E4M3FN with a bias to f32.
import sys

import torch


class Scaled(torch.nn.Module):
    def forward(self, a, b, sa, sb, ra, rb, bias):
        t = torch._scaled_mm(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), sa, sb, out_dtype=torch.bfloat16)
        r = torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), ra, rb, bias=bias, out_dtype=torch.float32)
        return t, r


args = (torch.rand(16, 32), torch.rand(32, 16), torch.rand(()), torch.rand(()), torch.rand(16, 1), torch.rand(1, 16), torch.rand(16))
torch.export.save(torch.export.export(Scaled(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten._scaled_mm
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[16,32],f32>, !torch.vtensor<[32,16],f32> -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}} -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}} -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[16,16],bf16>
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}}, !torch.vtensor<[16,1],f32> -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}}, !torch.vtensor<[1,16],f32> -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[16,16],f32>
# CHECK-NOT:   torch.aten._scaled_mm
# STATS:       "name": "scaled-mm"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "rowwise": 1,
# STATS-NEXT:  "tensorwise": 1
