# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A product with a nonzero K, and one whose K is dynamic (it may be nonzero when run), stay products.
import sys

import torch
from torch.export import Dim


class Products(torch.nn.Module):
    def forward(self, a, b, c, d):
        return a @ b, torch.mm(c, d)


args = (torch.randn(4, 3), torch.randn(3, 5), torch.randn(2, 6), torch.randn(6, 3))
k = Dim("k", min=0, max=64)
torch.export.save(torch.export.export(Products(), args, dynamic_shapes=(None, None, {1: k}, {0: k})), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.sum.dim_IntList
# CHECK:       torch.aten.mm %arg0, %arg1
# CHECK:       torch.aten.mm %arg2, %arg3
# STATS:       "name": "zero-k-products"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
