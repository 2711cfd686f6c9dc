# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Splits of a static dim are torch-mlir's own (it writes them as static slices): nothing matched.
import sys

import torch


class Chunks(torch.nn.Module):
    def forward(self, x):
        a, b = torch.split(x, [4, 5], 1)
        return a.sum(1) + b.sum(1)


torch.export.save(torch.export.export(Chunks(), (torch.rand(2, 9, 4),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.slice.Tensor %arg0, %int1, %int0, %int4, %int1 : {{.*}} -> !torch.vtensor<[2,4,4],f32>
# STATS:       "name": "dynamic-split"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
