# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target hip | filecheck %s
# A MoE layer's expert counts and grouped products, as transformers 5 computes them: histc of the
# sorted expert ids becomes comparisons and a sum; a grouped product of 2 rows (<= 4 experts, a
# decode step) gathers each row's expert weights into a multiply + sum; one of 6 rows multiplies
# every expert (bmm) and selects each row's own; a 3-D grouped product without offsets is a bmm.
# (PyTorch's meta function takes bf16 operands only; the gather form accumulates in f32.)
import sys

import torch


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 16, 8, dtype=torch.bfloat16))  # [E, K, N]

    def forward(self, ids2, x2, ids6, x6, a):
        counts = torch.histc(ids2.float(), bins=4, min=0, max=3)
        offs2 = torch.cumsum(counts, 0, dtype=torch.int32)
        offs6 = torch.cumsum(torch.histc(ids6.float(), bins=4, min=0, max=3), 0, dtype=torch.int32)
        return counts, torch._grouped_mm(x2, self.w, offs2), torch._grouped_mm(x6, self.w, offs6), torch._grouped_mm(a, self.w)


bf16 = torch.bfloat16
args = (torch.tensor([3, 1]), torch.randn(2, 16, dtype=bf16), torch.tensor([0, 0, 1, 2, 2, 3]), torch.randn(6, 16, dtype=bf16),
        torch.randn(4, 5, 16, dtype=bf16))
torch.export.save(torch.export.export(Experts(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.histc
# CHECK-NOT:   torch.aten._grouped_mm
# histc: each element's bin compared with every bin, counted.
# CHECK:       torch.aten.eq.Tensor {{.*}} -> !torch.vtensor<[2,4],i1>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[4],si64>
# Two rows: each row's expert weights gathered, multiplied and summed over K.
# CHECK:       %[[W:.+]] = "torch_c.from_builtin_tensor"{{.*}} -> !torch.vtensor<[4,16,8],bf16>
# CHECK:       torch.aten.index.Tensor{{.*}} %[[W]], {{.*}} -> !torch.vtensor<[2,16,8],bf16>
# CHECK:       torch.aten.mul.Tensor {{.*}} -> !torch.vtensor<[2,16,8],f32>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[2,8],f32>
# Six rows: every expert's product, each row's own selected.
# CHECK:       torch.aten.bmm {{.*}}, %[[W]] : {{.*}} -> !torch.vtensor<[4,6,8],bf16>
# CHECK:       torch.aten.where.self {{.*}} -> !torch.vtensor<[4,6,8],bf16>
# CHECK:       torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[6,8],bf16>
# Without offsets: a batch product.
# CHECK:       torch.aten.bmm %arg4, %[[W]] : {{.*}} -> !torch.vtensor<[4,5,8],bf16>
# CHECK-NOT:   torch.aten._grouped_mm

# STATS:       "name": "decompose-moe"
# STATS:       "rewrote": 5
# STATS:       "forms": {
# STATS-NEXT:  "batched": 1,
# STATS-NEXT:  "dense": 1,
# STATS-NEXT:  "gather": 1,
# STATS-NEXT:  "histc": 2
