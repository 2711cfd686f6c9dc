# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target hip | filecheck %s
# torch-mlir has no lowering for aten.slice_copy: on every target it becomes aten.slice (a view in
# value semantics), with the dynamic end kept.
import sys

import torch
from torch.export import Dim


class Cut(torch.nn.Module):
    def forward(self, cache, mask):
        n = mask.shape[1]
        return torch.ops.aten.slice_copy.Tensor(cache, 2, 0, n) * 2


args = (torch.randn(1, 2, 16, 4), torch.ones(1, 5))
torch.export.save(torch.export.export(Cut(), args, dynamic_shapes=(None, {1: Dim("n", min=1, max=16)})), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   slice_copy
# CHECK:       %[[N:.+]] = torch.aten.size.int %arg1, %int1
# CHECK:       torch.aten.slice.Tensor %arg0, %int2, %int0, %[[N]], %int1 : {{.*}} -> !torch.vtensor<[1,2,?,4],f32>
