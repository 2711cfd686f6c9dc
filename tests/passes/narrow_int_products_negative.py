# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Products in int32, int64 and f32 are left as they are.
import sys

import torch


class Wide(torch.nn.Module):
    def forward(self, a, b, x, y):
        return torch.mm(a, b), torch.mm(a.long(), b.long()), torch.mm(x, y)


args = (torch.randint(-9, 9, (4, 3), dtype=torch.int32), torch.randint(-9, 9, (3, 2), dtype=torch.int32), torch.rand(4, 3), torch.rand(3, 2))
torch.export.save(torch.export.export(Wide(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.mm %arg0, %arg1 : {{.*}} -> !torch.vtensor<[4,2],si32>
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[4,2],si64>
# CHECK:       torch.aten.mm %arg2, %arg3 : {{.*}} -> !torch.vtensor<[4,2],f32>
# STATS:       "name": "narrow-int-products"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
