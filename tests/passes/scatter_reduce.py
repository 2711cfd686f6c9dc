# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# scatter_reduce without self (IREE fails on torch-mlir's form of it with dynamic shapes) as eager
# computes it: the positions the index hits set to the reduction's identity (a scatter), then the
# scatter_reduce with self; mean: the sum over a scatter_add count (1 where nothing hits), floor
# division for integers. A negative scatter dim (iree-compile crashes on it) becomes non-negative.
import sys

import torch


class Scatters(torch.nn.Module):
    def forward(self, x, index, src, xi, srci):
        a = torch.scatter_reduce(x, 1, index, src, "amax", include_self=False)
        b = xi.clone().scatter_reduce_(0, index, srci, "mean", include_self=False)  # in place: functionalized
        c = torch.scatter_add(x, -1, index, src)
        return a, b, c


x, src = torch.randn(4, 5), torch.randn(3, 6)
index = torch.randint(0, 4, (3, 2))
xi, srci = torch.randint(-9, 10, (4, 5), dtype=torch.int32), torch.randint(-9, 10, (3, 6), dtype=torch.int32)
torch.export.save(torch.export.export(Scatters(), (x, index, src, xi, srci)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-DAG:   %[[ONE:.*]] = torch.vtensor.literal(dense<1> : tensor<4x5xsi32>)
# CHECK-DAG:   %[[ONES:.*]] = torch.vtensor.literal(dense<1> : tensor<3x6xsi32>)
# CHECK-DAG:   %[[ZEROS:.*]] = torch.vtensor.literal(dense<0> : tensor<4x5xsi32>)
# CHECK-DAG:   %[[ZERO:.*]] = torch.vtensor.literal(dense<0> : tensor<3x2xsi32>)
# CHECK-DAG:   %[[SUM:.*]] = torch.constant.str "sum"
# CHECK-DAG:   %[[TRUE:.*]] = torch.constant.bool true
# CHECK-DAG:   %[[AMAX:.*]] = torch.constant.str "amax"
# CHECK-DAG:   %[[NEGINF:.*]] = torch.vtensor.literal(dense<0xFF800000> : tensor<3x2xf32>)
# amax: -inf where the index points (one per index element), then amax with self.
# CHECK:       %[[FILLED:.*]] = torch.aten.scatter.src %arg0, %int1, %arg1, %[[NEGINF]]
# CHECK-NEXT:  torch.aten.scatter_reduce.two %[[FILLED]], %int1, %arg1, %arg2, %[[AMAX]], %[[TRUE]] : {{.*}} -> !torch.vtensor<[4,5],f32>
# mean: 0 where the index points, the sum with self, over the count of hits (0 -> 1), floor division
# (which the int-elementwise pass writes as a truncating division and a correction).
# CHECK:       %[[FILLEDI:.*]] = torch.aten.scatter.src %arg3, %int0, %arg1, %[[ZERO]]
# CHECK-NEXT:  %[[TOTAL:.*]] = torch.aten.scatter_reduce.two %[[FILLEDI]], %int0, %arg1, %arg4, %[[SUM]], %[[TRUE]]
# CHECK-NEXT:  %[[COUNT:.*]] = torch.aten.scatter_add %[[ZEROS]], %int0, %arg1, %[[ONES]]
# CHECK-NEXT:  %[[NONE:.*]] = torch.aten.eq.Scalar %[[COUNT]], %int0
# CHECK-NEXT:  %[[DIVISOR:.*]] = torch.aten.where.self %[[NONE]], %[[ONE]], %[[COUNT]]
# CHECK-NEXT:  torch.aten.div.Tensor_mode %[[TOTAL]], %[[DIVISOR]], %{{.*}} : {{.*}} -> !torch.vtensor<[4,5],si32>
# scatter_add along dim -1 of a 2-d x: along dim 1.
# CHECK:       torch.aten.scatter_add %arg0, %int1, %arg1, %arg2 : {{.*}} -> !torch.vtensor<[4,5],f32>
# CHECK-NOT:   %int-1
# STATS:       "name": "scatter-reduce"
# STATS:       "rewrote": 3
# STATS:       "forms": {
# STATS-NEXT:  "amax-without-self": 1
# STATS-NEXT:  "mean-without-self": 1
# STATS-NEXT:  "negative-dim": 1
