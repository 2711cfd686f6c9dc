# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# int8 mm and uint8 bmm (eager sums in the narrow type, wrapping) become int32 products of the widened
# operands, converted back: the low bits are the same.
import sys

import torch


class Narrow(torch.nn.Module):
    def forward(self, a, b, c, d):
        return torch.mm(a, b), torch.bmm(c, d)


args = (torch.randint(-100, 100, (16, 4), dtype=torch.int8), torch.randint(-100, 100, (4, 8), dtype=torch.int8),
        torch.randint(0, 255, (2, 3, 5), dtype=torch.uint8), torch.randint(0, 255, (2, 5, 6), dtype=torch.uint8))
torch.export.save(torch.export.export(Narrow(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.to.dtype %arg0, {{.*}} -> !torch.vtensor<[16,4],si32>
# CHECK:       torch.aten.to.dtype %arg1, {{.*}} -> !torch.vtensor<[4,8],si32>
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[16,8],si32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[16,8],si8>
# CHECK:       torch.aten.bmm {{.*}} -> !torch.vtensor<[2,3,6],si32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[2,3,6],ui8>
# STATS:       "name": "narrow-int-products"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "int8": 1,
# STATS-NEXT:  "uint8": 1
