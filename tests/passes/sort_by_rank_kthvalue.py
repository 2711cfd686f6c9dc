# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# kthvalue (torch-mlir lowers it to a tm_tensor.topk IREE 3.13 rejects: "region block must end with
# a linalg_ext.yield i1") becomes element k-1 of the ascending sort by rank, along dim 1, kept or not.
import sys

import torch


class Kth(torch.nn.Module):
    def forward(self, x):
        v, i = torch.kthvalue(x, 2, dim=1)
        w, j = torch.kthvalue(x, 3, dim=0, keepdim=True)
        return v, i, w, j


torch.export.save(torch.export.export(Kth(), (torch.randn(4, 6),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.kthvalue
# CHECK:       torch.aten.lt.Tensor {{.*}} -> !torch.vtensor<[4,6,6],i1>
# CHECK:       torch.aten.gather {{.*}} -> !torch.vtensor<[4,6],f32>
# CHECK:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[4,1],f32>
# CHECK:       torch.aten.squeeze.dim {{.*}} -> !torch.vtensor<[4],f32>
# CHECK:       torch.aten.lt.Tensor {{.*}} -> !torch.vtensor<[6,4,4],i1>
# CHECK:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,6],f32>
# CHECK-NOT:   torch.aten.kthvalue
# STATS:       "name": "sort-by-rank"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "kthvalue": 2
