# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# isfinite of a float tensor: not NaN and |x| != inf; of an int tensor: all true.
import sys

import torch


class Finite(torch.nn.Module):
    def forward(self, x, n):
        return torch.isfinite(x), torch.isfinite(n)


torch.export.save(torch.export.export(Finite(), (torch.rand(5), torch.arange(4))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.isfinite
# CHECK:       torch.vtensor.literal(dense<true> : tensor<4xi1>)
# isnan arrives as x != x, kept (x == x would have been folded to true).
# CHECK:       torch.aten.ne.Tensor %arg0, %arg0
# CHECK:       torch.aten.logical_not
# CHECK:       torch.aten.abs %arg0
# CHECK:       torch.aten.ne.Scalar {{.*}}, %floatInf
# CHECK:       torch.aten.bitwise_and.Tensor
# CHECK:       return {{.*}}, %0
# STATS:       "name": "isfinite"
# STATS:       "rewrote": 2
