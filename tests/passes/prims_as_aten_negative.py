# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# The ATen ops themselves (and prims ops that PyTorch's decompositions handle, such as
# prims.convert_element_type) are left to the decomposition table: nothing matched.
import sys

import torch


class Aten(torch.nn.Module):
    def forward(self, a, b):
        return a.squeeze(0), b.unflatten(1, (4, 3)), b.prod(1), torch.ops.prims.convert_element_type(b, torch.float64)


torch.export.save(torch.export.export(Aten(), (torch.rand(1, 2, 3), torch.rand(2, 12))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.squeeze.dim
# CHECK:       torch.aten.prod.dim_int
# STATS:       "name": "prims-as-aten"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
