# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# chunk(x, 3, 1) of a dynamic dim: three slices with bounds computed from the dim, no split_with_sizes.
import sys

import torch
from torch.export import Dim


class Chunks(torch.nn.Module):
    def forward(self, x):
        a, b, c = torch.chunk(x, 3, 1)
        return a + b + c


torch.export.save(torch.export.export(Chunks(), (torch.rand(2, 9, 4),), dynamic_shapes=({1: Dim.AUTO},)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.split_with_sizes
# CHECK:       torch.aten.slice.Tensor %arg0, %int1, %int0, {{.*}} -> !torch.vtensor<[2,?,4],f32>
# CHECK:       torch.aten.slice.Tensor %arg0, %int1, {{.*}} -> !torch.vtensor<[2,?,4],f32>
# CHECK:       torch.aten.slice.Tensor %arg0, %int1, {{.*}} -> !torch.vtensor<[2,?,4],f32>
# CHECK-NOT:   torch.aten.split_with_sizes
# STATS:       "name": "dynamic-split"
# STATS:       "rewrote": 1
