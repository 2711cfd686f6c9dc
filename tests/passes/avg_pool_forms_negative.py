# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Batched pooling, ceil mode counting the padding, and floor mode are torch-mlir's own: nothing matched.
import sys

import torch


class Pools(torch.nn.Module):
    def forward(self, x):
        return (torch.nn.functional.avg_pool2d(x, 3, 2), torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
                torch.nn.functional.avg_pool2d(x, 2, 2, 1, count_include_pad=False))


torch.export.save(torch.export.export(Pools(), (torch.rand(2, 3, 9, 9),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-COUNT-3: torch.aten.avg_pool2d %arg0
# STATS:       "name": "avg-pool-forms"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
