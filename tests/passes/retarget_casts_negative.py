# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --dtype f32 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# In f32 nothing is re-exported: the pass is skipped and the graph keeps its f32 math.
import sys

import torch


class M(torch.nn.Module):
    def forward(self, x):
        return x.float() * 2


torch.export.save(torch.export.export(M(), (torch.randn(2, 8),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.mul.Scalar {{.*}} -> !torch.vtensor<[2,8],f32>
# STATS:       "skipped": [
# STATS:       "name": "retarget-casts"
# STATS-NEXT:  "reason": "needs dtype f16/bf16/fp8/int8, compiling f32"
