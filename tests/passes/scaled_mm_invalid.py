# RUN: %python %s %t.pt2
# RUN: not llmc-opt %t.pt2 --pipeline --target cpu 2>&1 | filecheck %s
# Block-scaled (MX: e8m0 scales) products are refused with one line naming the op and the scales.
import sys

import torch


class Blocked(torch.nn.Module):
    def forward(self, a, b, sa, sb):
        return torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), sa, sb, out_dtype=torch.bfloat16)


args = (torch.rand(3, 32), torch.rand(32, 64), torch.ones(512, dtype=torch.float8_e8m0fnu), torch.ones(512, dtype=torch.float8_e8m0fnu))
torch.export.save(torch.export.export(Blocked(), args), sys.argv[1])

# CHECK:     llmc-opt: error: graph passes ({{.*}}scaled-mm{{.*}}): scaled-mm: aten._scaled_mm with scale_a of torch.float8_e8m0fnu (block-scaled, MX) is not supported
# CHECK-NOT: Traceback
