# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# prims ops called directly: squeeze, view_of and split_dim (aliasing outputs, which run_decompositions
# refuses) become aten.squeeze.dims, alias and a view; prims.prod over two dims becomes two aten.prod.dim_int,
# the later dim first.
import sys

import torch

prims = torch.ops.prims


class Prims(torch.nn.Module):
    def forward(self, a, b, c):
        return prims.squeeze(a, [0, 3]), prims.view_of(b) * 2, prims.split_dim(c, 1, 4), prims.prod(b, [0, 2])


args = (torch.rand(1, 2, 3, 1), torch.rand(3, 4, 5), torch.rand(2, 12))
torch.export.save(torch.export.export(Prims(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.prims
# CHECK:       torch.aten.squeeze.dim{{.*}} -> !torch.vtensor<[2,3],f32>
# CHECK:       torch.aten.view %arg2, {{.*}} -> !torch.vtensor<[2,4,3],f32>
# CHECK:       torch.aten.prod.dim_int %arg1, %int2, {{.*}} -> !torch.vtensor<[3,4],f32>
# CHECK:       torch.aten.prod.dim_int {{.*}}, %int0, {{.*}} -> !torch.vtensor<[4],f32>
# CHECK-NOT:   torch.prims
# STATS:       "name": "prims-as-aten"
# STATS:       "rewrote": 4
# STATS:       "forms": {
# STATS-NEXT:  "prod": 1,
# STATS-NEXT:  "split_dim": 1,
# STATS-NEXT:  "squeeze": 1,
# STATS-NEXT:  "view_of": 1
