# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Fixed-window max pooling and adaptive average pooling compile as they are: left alone.
import sys

import torch


class Pools(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, 2), torch.nn.functional.adaptive_avg_pool2d(x, 1)


torch.export.save(torch.export.export(Pools(), (torch.randn(1, 3, 8, 8),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.max_pool2d
# CHECK-NOT:   torch.aten.max.dim
# STATS:       "name": "adaptive-max-pool"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
