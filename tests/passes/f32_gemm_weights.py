# RUN: %python %s %t.pt2 %t.row.pt2
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --option fixed_row_products=true --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch x86-64-v3 --option fixed_row_products=true | filecheck %s --check-prefix=ROW
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --stats 2> %t.none.stats | filecheck %s --check-prefix=NONE
# RUN: filecheck %s --check-prefix=NONESTATS < %t.none.stats
# f32 on cpu, in a compile with fixed-row entry points (an LLM's prefill chunk: llmc compile sets
# fixed_row_products) where llmc's C kernels serve (AVX2 code, x86-64-v3): a linear weight [N, K] with
# N % 16 == 0 is stored in 16-channel panels [N/16, K, 16]; a product with a fixed row count (4 here) is
# llmc's many-row kernel over the panels, bias added after it; a one-row product (ROW) reads the weight
# unpacked again (permute + copy to [N, K]: IREE hoists that to load time). N = 12 is not a whole panel:
# that weight stays as it is. Without fixed-row entry points (NONE) the pass does not run.
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 12, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


torch.export.save(torch.export.export(M(), (torch.randn(4, 16),)), sys.argv[1])
torch.export.save(torch.export.export(M(), (torch.randn(1, 16),)), sys.argv[2])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"up.weight"> : tensor<2x16x16xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"up.bias"> : tensor<32xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"down.weight"> : tensor<12x32xf32>
# CHECK-LABEL: func.func @main
# CHECK-NOT:   torch.aten.permute
# CHECK:       call @__llmc_gemm_f32_4x2x16(%{{.*}}, %{{.*}}) : (tensor<4x16xf32>, tensor<2x16x16xf32>) -> tensor<4x32xf32>
# CHECK:       torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[4,32],f32>
# CHECK:       torch.aten.relu
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[4,32],f32>, !torch.vtensor<[32,12],f32> -> !torch.vtensor<[4,12],f32>
# CHECK:       flow.dispatch @__llmc_kernels::@gemm_f32
# CHECK:       func.call @llmc_gemm_f32(

# STATS:       "name": "f32-gemm-weights"
# STATS:       "matched": 2
# STATS:       "rewrote": 1
# STATS:       "12 output channels, not a multiple of 16"
# STATS:       "packed, 1 fixed many-row product(s) as C kernel calls": 1

# ROW-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"up.weight"> : tensor<2x16x16xf32>
# ROW-LABEL:   func.func @main
# ROW:         torch.aten.permute {{.*}} : !torch.vtensor<[2,16,16],f32>, !torch.list<int> -> !torch.vtensor<[2,16,16],f32>
# ROW:         torch.aten.view {{.*}} -> !torch.vtensor<[32,16],f32>
# ROW-NOT:     __llmc_gemm
# ROW:         torch.aten.mm %arg0, {{.*}} : !torch.vtensor<[1,16],f32>, !torch.vtensor<[16,32],f32> -> !torch.vtensor<[1,32],f32>

# NONE-DAG:    "util.global"() {initial_value = #stream.parameter.named<"model"::"up.weight"> : tensor<32x16xf32>
# NONE-NOT:    __llmc_gemm

# NONESTATS:   "name": "f32-gemm-weights",
# NONESTATS-NEXT: "reason": "no entry point with a fixed number of rows (prefill chunk or bucket)"
