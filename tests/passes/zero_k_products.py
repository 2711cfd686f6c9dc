# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target hip | filecheck %s
# Products over an empty inner dimension (IREE 3.13 is killed by SIGFPE on them) become the sums of
# their operands over K multiplied together, the linear's bias added; the batch product as well.
import sys

import torch


class Empty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(0, 5)

    def forward(self, x, a, b):
        return self.lin(x), torch.bmm(a, b)


args = (torch.randn(3, 0), torch.randn(2, 4, 0), torch.randn(2, 0, 6))
torch.export.save(torch.export.export(Empty(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.addmm
# CHECK-NOT:   torch.aten.bmm
# CHECK:       %[[SX:.+]] = torch.aten.sum.dim_IntList %arg{{[0-9]+}}, {{.*}} -> !torch.vtensor<[3,1],f32>
# CHECK:       %[[SW:.+]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,5],f32>
# CHECK:       torch.aten.mul.Tensor %[[SX]], %[[SW]] : {{.*}} -> !torch.vtensor<[3,5],f32>
# CHECK:       torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[3,5],f32>
# CHECK:       %[[SA:.+]] = torch.aten.sum.dim_IntList %arg{{[0-9]+}}, {{.*}} -> !torch.vtensor<[2,4,1],f32>
# CHECK:       %[[SB:.+]] = torch.aten.sum.dim_IntList %arg{{[0-9]+}}, {{.*}} -> !torch.vtensor<[2,1,6],f32>
# CHECK:       torch.aten.mul.Tensor %[[SA]], %[[SB]] : {{.*}} -> !torch.vtensor<[2,4,6],f32>
