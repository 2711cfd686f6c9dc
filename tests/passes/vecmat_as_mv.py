# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan | filecheck %s --check-prefix=VK
# A vector times a matrix with a dynamic number of columns (IREE's global-opt data tiling returns it
# padded on llvm-cpu) becomes the transposed matrix times a column; other targets keep the mm.
import sys

import torch
from torch.export import Dim


class VecMat(torch.nn.Module):
    def forward(self, v, b):
        return torch.matmul(v, b)


k, n = Dim("k"), Dim("n")
torch.export.save(torch.export.export(VecMat(), (torch.rand(4), torch.rand(4, 5)), dynamic_shapes=({0: k}, {0: k, 1: n})), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       %[[T:.+]] = torch.aten.permute %arg1, {{.*}} -> !torch.vtensor<[?,?],f32>
# CHECK:       %[[C:.+]] = torch.aten.unsqueeze %arg0, %int1 : {{.*}} -> !torch.vtensor<[?,1],f32>
# CHECK:       %[[P:.+]] = torch.aten.mm %[[T]], %[[C]] : {{.*}} -> !torch.vtensor<[?,1],f32>
# CHECK:       torch.aten.squeeze.dim %[[P]], %int1 : {{.*}} -> !torch.vtensor<[?],f32>
# STATS:       "name": "vecmat-as-mv"
# STATS:       "rewrote": 1
# VK:          torch.aten.unsqueeze %arg0, %int0
# VK:          torch.aten.mm {{.*}} -> !torch.vtensor<[1,?],f32>
