# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Products whose operands share a dtype are left alone, in f32 and in bf16.
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return x @ self.w, (x.to(torch.bfloat16) @ self.w.to(torch.bfloat16))


torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])

# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,8],f32> -> !torch.vtensor<[2,8],f32>
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[2,16],bf16>, !torch.vtensor<[16,8],bf16> -> !torch.vtensor<[2,8],bf16>

# STATS:       "name": "dtype-harmony"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
