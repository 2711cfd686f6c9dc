# RUN: %python %s %t.pt2 %t.row.pt2
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --dtype bf16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.row.pt2 --pipeline --target cpu --dtype bf16 --stats 2> %t.row.stats | filecheck %s --check-prefix=ROW
# RUN: filecheck %s --check-prefix=ROWSTATS < %t.row.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype bf16 --stats 2> %t.krow.stats | filecheck %s --check-prefix=KROW
# RUN: filecheck %s --check-prefix=KROWSTATS < %t.krow.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch znver3 --dtype bf16 | filecheck %s --check-prefix=KROWZEN3
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch x86-64-v4 --dtype bf16 | filecheck %s --check-prefix=KROWV4
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype bf16 --stats 2> %t.kgemm.stats | filecheck %s --check-prefix=KGEMM
# RUN: filecheck %s --check-prefix=KGEMMSTATS < %t.kgemm.stats
# bf16 on cpu: f32 math, bf16 weights stored as their int16 bits. A linear weight [N, K] is stored
# packed, [ceil(N/G), K, G] (G = 16 for IREE's own loops, 32 where llmc's C kernels serve: N = 12 padded
# to G with zero rows): with two input rows it is widened
# (int32 << 16, read as f32) and unpacked to [N, K] for the f32 matmul, or, where the C kernels serve (KGEMM),
# a fixed row count goes to llmc's many-row kernel over the packed bits; with one row (a decode step)
# the product is an elementwise multiply and a sum over K of the widened packed weight, K split
# (K/4, 4) into four partial sums, then the padding rows are sliced off. The embedding table gathers
# its rows' bits and widens only those; the 1-D bias is widened where used. The outputs go back to
# bf16 at the end (bf16-outputs).
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 16)
        self.lin = torch.nn.Linear(16, 12)

    def forward(self, ids):
        return self.lin(self.emb(ids))


torch.export.save(torch.export.export(M(), (torch.tensor([1, 2]),)), sys.argv[1])
torch.export.save(torch.export.export(M(), (torch.tensor([3]),)), sys.argv[2])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"lin.weight"> : tensor<1x16x16xi16>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"lin.bias"> : tensor<12xi16>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"emb.weight"> : tensor<10x16xi16>
# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.__lshift__.Scalar {{.*}} -> !torch.vtensor<[1,16,16],si32>
# CHECK:       call @__llmc_bitcast_1x16x16_i32_f32({{.*}}) : (tensor<1x16x16xi32>) -> tensor<1x16x16xf32>
# CHECK:       torch.aten.permute {{.*}} !torch.vtensor<[1,16,16],f32>, !torch.list<int> -> !torch.vtensor<[1,16,16],f32>
# CHECK:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[12,16],f32>
# CHECK:       torch.aten.embedding {{.*}} -> !torch.vtensor<[2,16],si16>
# CHECK:       torch.aten.__lshift__.Scalar {{.*}} -> !torch.vtensor<[2,16],si32>
# CHECK:       torch.aten.mm {{.*}} : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,12],f32>
# CHECK:       return {{.*}} : !torch.vtensor<[2,12],bf16>

# STATS:       "name": "bf16-weights"
# STATS:       "rewrote": 3
# STATS:       "packed": 1

# ROW-LABEL:   func.func @main
# ROW-NOT:     torch.aten.mm
# ROW:         call @__llmc_bitcast_1x16x16_i32_f32
# ROW:         torch.aten.view {{.*}} -> !torch.vtensor<[1,4,4,16],f32>
# ROW:         torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[1,4,4,1],f32>, !torch.vtensor<[1,4,4,16],f32> -> !torch.vtensor<[1,4,4,16],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,4,16],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[1,16],f32>
# ROW:         torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,12],f32>
# ROW-NOT:     torch.aten.mm
# ROW:         return

# ROWSTATS:    "packed, 1 one-row product(s) as a reduction": 1

# KROW-LABEL:  func.func @main
# KROW-NOT:    torch.aten.mm
# KROW:        call @__llmc_matvec_bf16_1x16(%{{.*}}, %{{.*}}) : (tensor<1x16xf32>, tensor<1x16x32xi16>) -> tensor<1x32xf32>
# KROW:        torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,12],f32>
# KROW-NOT:    torch.aten.sum.dim_IntList
# KROW:        %pairk = arith.constant 1024 : index
# KROW:        flow.dispatch @__llmc_kernels::@matvec_bf16
# KROW:        func.call @llmc_matvec_bf16(

# A module whose CPUs all have AVX-512F calls the loop's 512-bit form (compiler/ukernels.py bf16_matvec):
# KROWV4:      %pairk = arith.constant 1024 : index
# KROWV4:      flow.dispatch @__llmc_kernels::@matvec_bf16
# KROWV4:      func.func private @llmc_matvec_bf16_avx512(
# KROWV4:      func.call @llmc_matvec_bf16_avx512(

# A Zen 3 module reads every bf16 group pair side by side (compiler/ukernels.py BF16_PAIR_MIN_K_BY_CPU):
# KROWZEN3:    %pairk = arith.constant 0 : index
# KROWZEN3:    flow.dispatch @__llmc_kernels::@matvec_bf16

# KROWSTATS:   "packed, 1 one-row product(s) as C kernel calls": 1

# KGEMM-LABEL: func.func @main
# KGEMM-NOT:   torch.aten.mm
# KGEMM:       call @__llmc_gemm_bf16_2x1x16(%{{.*}}, %{{.*}}) : (tensor<2x16xf32>, tensor<1x16x32xi16>) -> tensor<2x32xf32>
# KGEMM:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[2,12],f32>
# KGEMM-NOT:   torch.aten.mm
# KGEMM:       flow.dispatch @__llmc_kernels::@gemm_bf16
# KGEMM:       func.call @llmc_gemm_bf16(

# KGEMMSTATS:  "packed, 1 fixed many-row product(s) as C kernel calls": 1
