# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Float clamp, float pow and a same-dtype threshold_backward are not this pass's: nothing rewritten
# (threshold_backward still goes through the base table's decomposition, a where).
import sys

import torch


class Floats(torch.nn.Module):
    def forward(self, x, e, g):
        return torch.clamp(x, -0.5, 0.5), torch.pow(x, e), torch.ops.aten.threshold_backward(g, x, 0.5)


torch.export.save(torch.export.export(Floats(), (torch.rand(3, 4), torch.rand(3, 4), torch.rand(3, 4))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.clamp %arg0
# CHECK:       torch.aten.pow.Tensor_Tensor %arg0, %arg1
# CHECK:       torch.aten.where.self
# STATS:       "name": "int-elementwise"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
