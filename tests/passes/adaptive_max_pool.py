# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Adaptive max pooling 10x9 -> 7x13 with indices (IREE rejects torch-mlir's pooling form of it) becomes,
# per axis from the last: the windows gathered, their maxima and first positions; the flat index is
# h * 9 + w.
import sys

import torch


class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveMaxPool2d((7, 13), return_indices=True)

    def forward(self, x):
        return self.pool(x)


torch.export.save(torch.export.export(Pool(), (torch.randn(1, 4, 10, 9),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.adaptive_max_pool2d
# The last axis: 13 bins of at most 2 of the 9 columns.
# CHECK:       torch.aten.index_select %arg0, %int3, {{.*}} -> !torch.vtensor<[1,4,10,26],f32>
# CHECK:       torch.aten.max.dim {{.*}} -> !torch.vtensor<[1,4,10,13],f32>, !torch.vtensor<[1,4,10,13],si64>
# Then the rows: 7 bins of at most 3 of the 10 rows.
# CHECK:       torch.aten.index_select {{.*}} -> !torch.vtensor<[1,4,21,13],f32>
# CHECK:       torch.aten.max.dim {{.*}} -> !torch.vtensor<[1,4,7,13],f32>, !torch.vtensor<[1,4,7,13],si64>
# CHECK:       torch.aten.mul.Scalar {{.*}}, %int9 : {{.*}} -> !torch.vtensor<[1,4,7,13],si64>
# CHECK:       torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[1,4,7,13],si64>
# CHECK-NOT:   torch.aten.adaptive_max_pool2d
# STATS:       "name": "adaptive-max-pool"
# STATS:       "rewrote": 1
# STATS:       "forms": {
# STATS-NEXT:  "2d": 1
