# RUN: %python %s %t.pt2
# RUN: not llmc-opt %t.pt2 --pipeline --target cpu 2>&1 | filecheck %s
# A histogram whose range comes from the data (torch.histc's default min = max = 0) has no
# rewrite: the pass refuses it in one line, naming the op and the values.
import sys

import torch


class DataRange(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4)


torch.export.save(torch.export.export(DataRange(), (torch.randn(10),)), sys.argv[1])

# CHECK:     llmc-opt: error: graph passes ({{.*}}decompose-moe{{.*}}): decompose-moe: aten.histc with min=0, max=0: a range taken from the data (min == max) is not supported; give an explicit min < max
# CHECK-NOT: While executing
# CHECK-NOT: Traceback
