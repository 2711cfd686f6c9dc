# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# multinomial with replacement: uniform draws scaled by each row's total, counted against the row's
# cumulative sum; without replacement: the top-k of log(w) - log(-log(u)).
import sys

import torch


class Draw(torch.nn.Module):
    def forward(self, p):
        return torch.multinomial(p, 64, replacement=True), torch.multinomial(p, 3, replacement=False)


torch.export.save(torch.export.export(Draw(), (torch.rand(4, 10),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.multinomial
# CHECK:       torch.aten.cumsum %arg0
# CHECK:       torch.aten.uniform
# CHECK:       torch.aten.le.Tensor {{.*}} -> !torch.vtensor<[4,64,10],i1>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[4,64],si64>
# CHECK:       torch.aten.log
# STATS:       "name": "multinomial"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "no-replacement": 1,
# STATS-NEXT:  "replacement": 1
