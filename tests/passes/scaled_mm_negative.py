# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A plain product of fp8 values widened by hand (no _scaled_mm) is not this pass's: left as it is.
import sys

import torch


class Plain(torch.nn.Module):
    def forward(self, a, b):
        return torch.mm(a.to(torch.float8_e4m3fn).float(), b.to(torch.float8_e4m3fn).float())


torch.export.save(torch.export.export(Plain(), (torch.rand(4, 8), torch.rand(8, 3))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.mm
# STATS:       "name": "scaled-mm"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
