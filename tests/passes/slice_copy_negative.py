# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A plain slice is not a slice_copy: left as it is, and the pass counts nothing.
import sys

import torch


class Cut(torch.nn.Module):
    def forward(self, x):
        return x[:, 1:3] * 2


torch.export.save(torch.export.export(Cut(), (torch.randn(4, 8),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.slice.Tensor %arg0, %int1, %int1, %int3, %int1
# STATS:       "name": "slice-copy"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
