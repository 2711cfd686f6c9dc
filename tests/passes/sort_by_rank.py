# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# A sort of expert ids over a dynamic length and a router's top-2 (a MoE layer's two) become ranks
# counted by comparing every pair, the indices picked by rank and the values gathered: no
# aten.sort or aten.topk is left for IREE's in-place sort.
import sys

import torch
from torch.export import Dim


class Route(torch.nn.Module):
    def forward(self, ids, logits):
        values, perm = torch.sort(ids)
        weights, experts = torch.topk(logits.softmax(-1), 2)
        return values, perm, weights, experts


args = (torch.tensor([3, 0, 2, 0, 1, 3]), torch.randn(5, 4))
torch.export.save(torch.export.export(Route(), args, dynamic_shapes=({0: Dim("s", min=2, max=64)}, None)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.sort
# CHECK-NOT:   torch.aten.topk
# sort: every pair of the ? ids compared, each id's rank counted, the indices gathered by rank.
# CHECK:       torch.aten.lt.Tensor {{.*}} -> !torch.vtensor<[?,?],i1>
# CHECK:       %[[RANK:.+]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[?],si64>
# CHECK:       torch.aten.eq.Tensor {{.*}} -> !torch.vtensor<[?,?],i1>
# CHECK:       %[[PERM:.+]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[?],si64>
# CHECK:       torch.aten.gather %arg0, %int-1, %[[PERM]]
# topk: the same on each row of 4 (NaN-aware), descending, the first 2 kept.
# CHECK:       torch.aten.lt.Tensor {{.*}} -> !torch.vtensor<[5,4,4],i1>
# CHECK:       torch.aten.ne.Tensor %[[X:.+]], %[[X]] : {{.*}} -> !torch.vtensor<[5,1,4],i1>
# CHECK:       torch.aten.gather {{.*}} -> !torch.vtensor<[5,4],f32>
# CHECK:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[5,2],f32>
# CHECK-NOT:   torch.aten.sort
# STATS:       "name": "sort-by-rank"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "sort": 1,
# STATS-NEXT:  "topk": 1
