# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Batched pooling, ceil mode counting the padding, floor mode, and ceil mode without counting padding on
# dynamic sizes (torch-mlir's own form is right there) are torch-mlir's: nothing matched.
import sys

import torch
from torch.export import Dim


class Pools(torch.nn.Module):
    def forward(self, x):
        return (torch.nn.functional.avg_pool2d(x, 3, 2), torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
                torch.nn.functional.avg_pool2d(x, 2, 2, 1, count_include_pad=False),
                torch.nn.functional.avg_pool2d(x, 3, 3, 1, ceil_mode=True, count_include_pad=False))


torch.export.save(torch.export.export(Pools(), (torch.rand(2, 3, 9, 9),), dynamic_shapes=({2: Dim.AUTO, 3: Dim.AUTO},)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-COUNT-4: torch.aten.avg_pool2d %arg0, {{.*}} : !torch.vtensor<[2,3,?,?],f32>
# STATS:       "name": "avg-pool-forms"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
