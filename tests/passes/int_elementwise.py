# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# An int tensor clamped by float bounds is converted first; integer pow becomes squarings selected by
# the exponent's bits; a mixed-dtype threshold_backward keeps the promoted (float) dtype; integer floor
# division is the truncating one, corrected where the remainder's sign is unlike the divisor's.
import sys

import torch


class Ints(torch.nn.Module):
    def forward(self, x, b, e, g, s):
        return torch.clamp(x, -2.5, 2.5), torch.pow(b, e), torch.ops.aten.threshold_backward(g, s, 0.5), torch.div(g, -3, rounding_mode="floor")


args = (torch.randint(-5, 5, (3, 4)), torch.randint(-3, 4, (2, 3), dtype=torch.int32), torch.randint(0, 6, (2, 3), dtype=torch.int32),
        torch.randint(-9, 9, (4, 5)), torch.rand(4, 5))
torch.export.save(torch.export.export(Ints(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.pow.Tensor_Tensor
# CHECK:       torch.aten.to.dtype %arg0, {{.*}} -> !torch.vtensor<[3,4],f32>
# CHECK:       torch.aten.clamp {{.*}} -> !torch.vtensor<[3,4],f32>
# CHECK:       torch.aten.bitwise_and.Scalar {{.*}}, %int1 : {{.*}} -> !torch.vtensor<[2,3],si32>
# CHECK:       torch.aten.mul.Tensor {{.*}}, %arg1 : {{.*}} -> !torch.vtensor<[2,3],si32>
# CHECK:       torch.aten.__rshift__.Scalar
# CHECK:       torch.aten.where.self {{.*}} -> !torch.vtensor<[4,5],f32>
# CHECK:       torch.aten.div.Tensor_mode %arg3, {{.*}}, %str{{.*}} -> !torch.vtensor<[4,5],si64>
# CHECK:       torch.aten.gt.Scalar
# CHECK:       torch.aten.sub.Tensor {{.*}} -> !torch.vtensor<[4,5],si64>
# STATS:       "name": "int-elementwise"
# STATS:       "rewrote": 4
# STATS:       "forms": {
# STATS-NEXT:  "clamp": 1,
# STATS-NEXT:  "div_floor": 1,
# STATS-NEXT:  "pow": 1,
# STATS-NEXT:  "threshold_backward": 1
