# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Experts run without histc or a grouped product (transformers' "batched_mm" experts: each
# (token, expert) pair's weights gathered, then a batch product) are left as they are, and the
# pass counts nothing.
import sys

import torch


class BatchedExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8, 16))  # [E, N, K]

    def forward(self, x, expert_ids):
        return torch.bmm(self.w[expert_ids], x.unsqueeze(-1)).squeeze(-1)


torch.export.save(torch.export.export(BatchedExperts(), (torch.randn(6, 16), torch.tensor([0, 3, 1, 1, 2, 0]))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.index.Tensor{{.*}} -> !torch.vtensor<[6,8,16],f32>
# CHECK:       torch.aten.bmm {{.*}} -> !torch.vtensor<[6,8,1],f32>
# CHECK-NOT:   torch.aten.where.self
# STATS:       "name": "decompose-moe"
# STATS-NEXT:  "kind": "graph"
# STATS-NEXT:  "matched": 0
