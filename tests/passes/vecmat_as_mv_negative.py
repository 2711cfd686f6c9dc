# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A static N (compiles right, and data tiling keeps its fast form) and a [1, K] x [K, N] product that
# stays 2-D are left as they are.
import sys

import torch
from torch.export import Dim


class Products(torch.nn.Module):
    def forward(self, v, b, row, c):
        return torch.matmul(v, b), torch.mm(row, c)


n = Dim("n")
args = (torch.rand(4), torch.rand(4, 5), torch.rand(1, 4), torch.rand(4, 6))
torch.export.save(torch.export.export(Products(), args, dynamic_shapes=(None, None, None, {1: n})), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[1,5],f32>
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[1,?],f32>
# CHECK-NOT:   torch.aten.permute
# STATS:       "name": "vecmat-as-mv"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
