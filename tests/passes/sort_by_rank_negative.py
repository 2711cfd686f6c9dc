# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A reduction that picks one element (max with its index, argmin) is no sort: left as it is, and
# the pass counts nothing.
import sys

import torch


class Pick(torch.nn.Module):
    def forward(self, x):
        values, index = torch.max(x, dim=-1)
        return values, index, torch.argmin(x, dim=0)


torch.export.save(torch.export.export(Pick(), (torch.randn(5, 4),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.max.dim %arg0
# CHECK:       torch.aten.min.dim %arg0
# CHECK-NOT:   torch.aten.lt.Tensor
# STATS:       "name": "sort-by-rank"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
