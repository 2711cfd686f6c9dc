# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx942 --dtype bf16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# An f32 .pt2 compiled in bf16: the f32 -> f32 casts the export baked in (x.float(), x.to(x.dtype))
# would hand f32 activations to bf16 weights; they go, so the linear runs in bf16 (hip: native bf16
# math). The int cast stays.
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x.float())
        return h.to(h.dtype) * 2, (x > 0).to(torch.int32)


torch.export.save(torch.export.export(M(), (torch.randn(2, 8),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-SAME:  %arg0: !torch.vtensor<[2,8],f32>
# CHECK:       torch.aten.to.dtype %arg0, %int15{{.*}} -> !torch.vtensor<[2,8],bf16>
# CHECK:       (tensor<8x8xbf16>)
# CHECK:       torch.aten.mul.Scalar {{.*}} -> !torch.vtensor<[2,8],bf16>
# CHECK:       -> !torch.vtensor<[2,8],si32>

# STATS:       "name": "retarget-casts"
# STATS-NEXT:  "kind": "source"
