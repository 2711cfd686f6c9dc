# RUN: %python %s %t.pt2 %t.row.pt2
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --dtype fp8 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.row.pt2 --pipeline --target cpu --dtype fp8 --stats 2> %t.row.stats | filecheck %s --check-prefix=ROW
# RUN: filecheck %s --check-prefix=ROWSTATS < %t.row.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype fp8 --stats 2> %t.krow.stats | filecheck %s --check-prefix=KROW
# RUN: filecheck %s --check-prefix=KROWSTATS < %t.krow.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype fp8 | filecheck %s --check-prefix=KMM
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch znver4 --dtype fp8 --stats 2> %t.kpair.stats | filecheck %s --check-prefix=KPAIR
# RUN: filecheck %s --check-prefix=KPAIRSTATS < %t.kpair.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch znver4 --dtype fp8 | filecheck %s --check-prefix=KPAIRMM
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx942 --dtype fp8 | filecheck %s --check-prefix=FNUZ
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx950 --dtype fp8 | filecheck %s --check-prefix=FN
# Both linear weights become 1-byte parameters with an f32 scale per output row. cpu has no fp8
# arithmetic: the codes are decoded with three integer ops (shifted to the top byte, shifted back
# arithmetically into an f32's places and masked; times 2^120 folded into the scale) and the
# matmul runs in f32. On cpu the codes are stored packed, [N/G, K, G]: with two input rows the
# decoded weight is unpacked to [N, K] for the matmul; with one row (a decode step) the product is
# an elementwise multiply and a sum over K of the packed weight (K split (K/4, 4): four partial
# sums per output, added last), scaled per output after the sum. G is 8, or 32 where the C
# kernels compute the products (the KROW and KMM checks; rows padded with zero codes to 32): one row
# through the matvec kernel, a fixed number of rows (two here; a prefill chunk's) through the many-row one.
# gfx942 decodes natively from E4M3FNUZ, gfx950 from E4M3FN, in f16, in the [N, K] layout.
import sys

import torch

m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
torch.export.save(torch.export.export(m, (torch.randn(2, 16),)), sys.argv[1])
torch.export.save(torch.export.export(m, (torch.randn(1, 16),)), sys.argv[2])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<4x16x8xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight_fp8_scale"> : tensor<32x1xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<1x32x8xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.bias"> : tensor<32xf32>
# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.__lshift__.Scalar {{.*}} -> !torch.vtensor<[4,16,8],si32>
# CHECK-NOT:   torch.aten.bitwise_or
# CHECK:       torch.aten.__rshift__.Scalar {{.*}} -> !torch.vtensor<[4,16,8],si32>
# CHECK:       torch.aten.bitwise_and.Scalar {{.*}} -> !torch.vtensor<[4,16,8],si32>
# CHECK-NOT:   torch.aten.bitwise_or
# CHECK:       call @__llmc_bitcast_4x16x8_i32_f32({{.*}}) : (tensor<4x16x8xi32>) -> tensor<4x16x8xf32>
# CHECK:       torch.aten.mul.Tensor {{.*}} !torch.vtensor<[4,16,8],f32>, !torch.vtensor<[4,1,8],f32> -> !torch.vtensor<[4,16,8],f32>
# CHECK:       torch.aten.permute {{.*}} !torch.vtensor<[4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[4,8,16],f32>
# CHECK:       torch.aten.view {{.*}} -> !torch.vtensor<[32,16],f32>
# CHECK:       torch.aten.mm %arg0, {{.*}} : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,32],f32>
# CHECK-NOT:   torch.aten.sum.dim_IntList
# CHECK-NOT:   f8E4M3

# STATS:       "name": "fp8-weights"
# STATS:       "rewrote": 2
# STATS:       "per-channel software, packed": 2

# ROW-LABEL:   func.func @main(%arg0: !torch.vtensor<[1,16],f32>)
# ROW-NOT:     torch.aten.mm
# ROW:         call @__llmc_bitcast_4x16x8_i32_f32
# ROW:         torch.aten.view {{.*}} -> !torch.vtensor<[4,4,4,8],f32>
# ROW:         torch.aten.view %arg0, {{.*}} -> !torch.vtensor<[1,4,4,1],f32>
# ROW:         torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[1,4,4,1],f32>, !torch.vtensor<[4,4,4,8],f32> -> !torch.vtensor<[4,4,4,8],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} : !torch.vtensor<[4,4,4,8],f32>, {{.*}} -> !torch.vtensor<[4,4,8],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} : !torch.vtensor<[4,4,8],f32>, {{.*}} -> !torch.vtensor<[4,8],f32>
# ROW:         torch.aten.view {{.*}} -> !torch.vtensor<[1,32],f32>
# ROW:         torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[1,32],f32>, !torch.vtensor<[1,32],f32> -> !torch.vtensor<[1,32],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} : !torch.vtensor<[1,8,4,8],f32>, {{.*}} -> !torch.vtensor<[1,4,8],f32>
# ROW:         torch.aten.sum.dim_IntList {{.*}} : !torch.vtensor<[1,4,8],f32>, {{.*}} -> !torch.vtensor<[1,8],f32>
# ROW-NOT:     torch.aten.mm
# ROW:         return

# ROWSTATS:    "per-channel software, packed, 1 one-row product(s) as a reduction": 2

# KROW-LABEL:  func.func @main(%arg0: !torch.vtensor<[1,16],f32>)
# KROW-NOT:    torch.aten.mm
# KROW:        call @__llmc_matvec_fp8_1x16(%{{.*}}, %{{.*}}) : (tensor<1x16xf32>, tensor<1x16x32xi8>) -> tensor<1x32xf32>
# KROW:        torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[1,32],f32>, !torch.vtensor<[1,32],f32> -> !torch.vtensor<[1,32],f32>
# KROW:        call @__llmc_matvec_fp8_1x32(%{{.*}}, %{{.*}}) : (tensor<1x32xf32>, tensor<1x32x32xi8>) -> tensor<1x32xf32>
# KROW:        torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,8],f32>
# KROW-NOT:    torch.aten.sum.dim_IntList
# KROW:        func.func private @__llmc_matvec_fp8_1x16(%x: tensor<1x16xf32>, %p: tensor<1x16x32xi8>) -> tensor<1x32xf32>
# KROW:        %ahead = arith.constant 512 : index
# KROW:        flow.dispatch @__llmc_kernels::@matvec_fp8[%g, %per](%x, %p, %k, %g, %per, %ahead)
# KROW:        stream.executable private @__llmc_kernels attributes {hal.executable.objects = #hal.executable.objects<{#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {}> = [#hal.executable.object<{path = "{{.*}}matvec_x86_64-{{[0-9a-f]+}}.o"}>]}>}
# KROW:        func.call @llmc_matvec_fp8(%x, %p, %y, %k, %g, %per, %wg, %ahead)

# KROWSTATS:   "per-channel software, packed, 1 one-row product(s) as C kernel calls": 2

# KMM-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<1x16x32xi8>
# KMM-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<1x32x32xi8>
# KMM-LABEL:   func.func @main
# KMM-NOT:     torch.aten.mm
# KMM:         call @__llmc_gemm_fp8_2x1x16(%{{.*}}, %{{.*}}) : (tensor<2x16xf32>, tensor<1x16x32xi8>) -> tensor<2x32xf32>
# KMM:         call @__llmc_gemm_fp8_2x1x32(%{{.*}}, %{{.*}}) : (tensor<2x32xf32>, tensor<1x32x32xi8>) -> tensor<2x32xf32>
# KMM:         torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[2,8],f32>
# KMM-NOT:     torch.aten.mm
# KMM:         flow.dispatch @__llmc_kernels::@gemm_fp8
# KMM:         func.call @llmc_gemm_fp8(

# A module whose every CPU has AVX512_BF16 (Zen 4 here) stores the weights in the pair layout (64 channels; rows
# padded to 64) for the dot-product kernel, whose x is two bf16 halves of x * 2^32 made in the dispatch's
# body (compiler/ukernels.py fp8_x_halves); its many-row products read the same layout:
# KPAIR-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<1x16x64xi8>
# KPAIR-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<1x32x64xi8>
# KPAIR:       call @__llmc_matvec_fp8dp_1x16(%{{.*}}, %{{.*}}) : (tensor<1x16xf32>, tensor<1x16x64xi8>) -> tensor<1x64xf32>
# KPAIR:       torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,32],f32>
# KPAIR:       call @__llmc_matvec_fp8dp_1x32(%{{.*}}, %{{.*}}) : (tensor<1x32xf32>, tensor<1x32x64xi8>) -> tensor<1x64xf32>
# KPAIR-NOT:   call @__llmc_matvec_fp8_
# KPAIR:       func.func private @__llmc_matvec_fp8dp_1x16(%x: tensor<1x16xf32>, %p: tensor<1x16x64xi8>) -> tensor<1x64xf32>
# KPAIR:       %xq = linalg.generic {{.*}} ins(%x : tensor<1x16xf32>) outs(%xe : tensor<2x16xi16>)
# KPAIR:       %xs = arith.constant 4294967296.0 : f32
# KPAIR:       flow.dispatch @__llmc_kernels::@matvec_fp8dp[%g, %per](%xq, %p, %k, %g, %per) : (tensor<2x16xi16>, tensor<1x16x64xi8>
# KPAIR:       func.func private @llmc_matvec_fp8dp(memref<?xi16>, memref<?xi8>, memref<?xf32>
# KPAIR:       func.call @llmc_matvec_fp8dp(%x, %p, %y, %k, %g, %per, %wg)

# KPAIRSTATS:  "per-channel software, packed in pairs, 1 one-row product(s) as C kernel calls": 2

# KPAIRMM:     call @__llmc_gemm_fp8dp_2x1x16(%{{.*}}, %{{.*}}) : (tensor<2x16xf32>, tensor<1x16x64xi8>) -> tensor<2x64xf32>
# KPAIRMM:     call @__llmc_gemm_fp8dp_2x1x32(%{{.*}}, %{{.*}}) : (tensor<2x32xf32>, tensor<1x32x64xi8>) -> tensor<2x64xf32>
# KPAIRMM:     func.call @llmc_gemm_fp8dp(

# FNUZ:        torch.aten.view.dtype {{.*}} -> !torch.vtensor<[32,16],f8E4M3FNUZ>
# FNUZ:        torch.aten.to.dtype {{.*}} -> !torch.vtensor<[32,16],f16>
# FN:          torch.aten.view.dtype {{.*}} -> !torch.vtensor<[32,16],f8E4M3FN>
