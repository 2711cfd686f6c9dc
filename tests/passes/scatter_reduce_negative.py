# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# scatter_reduce with self (sum, prod, amax, amin), scatter and scatter_add, with a non-negative dim,
# compile and run right as torch-mlir lowers them (IREE's scatter): left as they are, nothing counted.
import sys

import torch


class Scatters(torch.nn.Module):
    def forward(self, x, index, src):
        reduced = tuple(torch.scatter_reduce(x, 1, index, src, r) for r in ("sum", "prod", "amax", "amin"))
        return reduced + (torch.scatter(x, 0, index, src), torch.scatter(x, 0, index, 2.0), torch.scatter_add(x, 0, index, src))


torch.export.save(torch.export.export(Scatters(), (torch.randn(4, 3), torch.randint(0, 3, (2, 3)), torch.randn(2, 3))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-DAG:   %[[TRUE:.*]] = torch.constant.bool true
# CHECK-DAG:   %[[SUM:.*]] = torch.constant.str "sum"
# CHECK-DAG:   %[[PROD:.*]] = torch.constant.str "prod"
# CHECK-DAG:   %[[AMAX:.*]] = torch.constant.str "amax"
# CHECK-DAG:   %[[AMIN:.*]] = torch.constant.str "amin"
# CHECK:       torch.aten.scatter_reduce.two %arg0, %int1, %arg1, %arg2, %[[SUM]], %[[TRUE]]
# CHECK-NEXT:  torch.aten.scatter_reduce.two %arg0, %int1, %arg1, %arg2, %[[PROD]], %[[TRUE]]
# CHECK-NEXT:  torch.aten.scatter_reduce.two %arg0, %int1, %arg1, %arg2, %[[AMAX]], %[[TRUE]]
# CHECK-NEXT:  torch.aten.scatter_reduce.two %arg0, %int1, %arg1, %arg2, %[[AMIN]], %[[TRUE]]
# CHECK-NEXT:  torch.aten.scatter.src %arg0, %int0, %arg1, %arg2
# scatter of a value: torch-mlir writes the value out per index element.
# CHECK-NEXT:  torch.aten.scatter.src %arg0, %int0, %arg1, %{{.*}}
# CHECK-NEXT:  torch.aten.scatter_add %arg0, %int0, %arg1, %arg2
# CHECK-NOT:   torch.aten.scatter
# STATS:       "name": "scatter-reduce"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
