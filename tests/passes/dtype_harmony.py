# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# The field failure: a Llama linear whose input and weight dtypes differ. torch.export records it
# (eager raises); both directions get the narrower operand widened to f32 and the product cast to
# the dtype the program declares (the input's).
import sys

import torch
import torch.nn.functional as F


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 16).to(torch.bfloat16))
        self.v = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        a = F.linear(x, self.w)  # f32 x bf16 -> f32
        return a, F.linear(a.to(torch.bfloat16), self.v)  # bf16 x f32 -> bf16


torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[16,8],f32>
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,8],f32> -> !torch.vtensor<[2,8],f32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[2,8],f32>
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[2,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[2,4],f32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[2,4],bf16>
# CHECK-NOT:   torch.aten.mm {{.*}}bf16{{.*}}f32

# STATS:       "name": "dtype-harmony"
# STATS:       "rewrote": 2
# STATS:       "bfloat16xfloat32->float32": 2
