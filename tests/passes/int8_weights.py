# RUN: %python %s %t.pt2 %t.row.pt2
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --dtype int8 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.row.pt2 --pipeline --target cpu --dtype int8 --stats 2> %t.row.stats | filecheck %s --check-prefix=ROW
# RUN: filecheck %s --check-prefix=ROWSTATS < %t.row.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.row.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype int8 --stats 2> %t.krow.stats | filecheck %s --check-prefix=KROW
# RUN: filecheck %s --check-prefix=KROWSTATS < %t.krow.stats
# RUN: env LLMC_CPU_KERNELS=on llmc-opt %t.pt2 --pipeline --target cpu --arch x86-64-v3 --dtype int8 --stats 2> %t.kmm.stats | filecheck %s --check-prefix=KMM
# RUN: filecheck %s --check-prefix=KMMSTATS < %t.kmm.stats
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx942 --dtype int8 --stats 2> %t.hip.stats | filecheck %s --check-prefix=GPU
# RUN: filecheck %s --check-prefix=GPUSTATS < %t.hip.stats
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --dtype int8 | filecheck %s --check-prefix=GPU
# Both linear weights become int8 parameters with an f32 scale per output row (`_int8_scale`). The
# decode is one conversion, int8 -> f32, then the scale multiply (no bit tricks, no 2^120 factor):
# on cpu the codes are stored packed, [N/8, K, 8] (as fp8's): with two input rows the converted
# weight is scaled and unpacked to [N, K] for the f32 matmul; with one row (a decode step) the
# product is an elementwise multiply and a sum over K of the packed weight (K split (K/4, 4): four
# partial sums per output), scaled per output after the sum. Where the C kernels compute the products
# (KROW, KMM) the groups are 32 channels (rows padded with zero codes to 32): one row through the
# matvec kernel, a fixed number of rows (two here; a prefill chunk's) through the many-row one, both
# weights (with 8-channel groups until 2026-12-01 the second weight's one group kept the unpacked
# matmul: the many-row loop took groups in pairs). On GPUs (gfx942, SPIR-V) the codes keep
# the [N, K] layout and the f32 decode is cast to f16, the compute dtype there.
import sys

import torch

m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
torch.export.save(torch.export.export(m, (torch.randn(2, 16),)), sys.argv[1])
torch.export.save(torch.export.export(m, (torch.randn(1, 16),)), sys.argv[2])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<4x16x8xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight_int8_scale"> : tensor<32x1xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<1x32x8xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight_int8_scale"> : tensor<8x1xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.bias"> : tensor<32xf32>
# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.to.dtype {{.*}} : !torch.vtensor<[4,16,8],si8>, {{.*}} -> !torch.vtensor<[4,16,8],f32>
# CHECK:       torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[4,16,8],f32>, !torch.vtensor<[4,1,8],f32> -> !torch.vtensor<[4,16,8],f32>
# CHECK:       torch.aten.permute {{.*}} !torch.vtensor<[4,16,8],f32>, !torch.list<int> -> !torch.vtensor<[4,8,16],f32>
# CHECK:       torch.aten.view {{.*}} -> !torch.vtensor<[32,16],f32>
# CHECK:       torch.aten.mm %arg0, {{.*}} : !torch.vtensor<[2,16],f32>, !torch.vtensor<[16,32],f32>
# CHECK-NOT:   torch.aten.sum.dim_IntList
# CHECK-NOT:   torch.aten.__lshift__
# CHECK-NOT:   torch.aten.view.dtype
# CHECK:       return

# STATS:       "name": "int8-weights"
# STATS:       "rewrote": 2
# STATS:       "per-channel int8, packed": 2

# ROW-LABEL:   func.func @main(%arg0: !torch.vtensor<[1,16],f32>)
# ROW-NOT:     torch.aten.mm
# ROW:         torch.aten.to.dtype {{.*}} : !torch.vtensor<[4,16,8],si8>, {{.*}} -> !torch.vtensor<[4,16,8],f32>
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

# ROWSTATS:    "per-channel int8, packed, 1 one-row product(s) as a reduction": 2

# KROW-LABEL:  func.func @main(%arg0: !torch.vtensor<[1,16],f32>)
# KROW-NOT:    torch.aten.mm
# KROW:        call @__llmc_matvec_int8_1x16(%{{.*}}, %{{.*}}) : (tensor<1x16xf32>, tensor<1x16x32xi8>) -> tensor<1x32xf32>
# KROW:        call @__llmc_matvec_int8_1x32(%{{.*}}, %{{.*}}) : (tensor<1x32xf32>, tensor<1x32x32xi8>) -> tensor<1x32xf32>
# KROW:        torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[1,8],f32>
# KROW-NOT:    torch.aten.sum.dim_IntList
# KROW:        flow.dispatch @__llmc_kernels::@matvec_int8
# KROW:        func.call @llmc_matvec_int8(

# KROWSTATS:   "per-channel int8, packed, 1 one-row product(s) as C kernel calls": 2

# GPU-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<32x16xi8>
# GPU-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight_int8_scale"> : tensor<32x1xf32>
# GPU-DAG:     "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<8x32xi8>
# GPU-LABEL:   func.func @main
# GPU:         torch.aten.to.dtype {{.*}} : !torch.vtensor<[8,32],si8>, {{.*}} -> !torch.vtensor<[8,32],f32>
# GPU-NEXT:    util.global.load
# GPU-NEXT:    torch_c.from_builtin_tensor
# GPU-NEXT:    torch.aten.mul.Tensor {{.*}} : !torch.vtensor<[8,32],f32>, !torch.vtensor<[8,1],f32> -> !torch.vtensor<[8,32],f32>
# GPU-NEXT:    torch.aten.to.dtype {{.*}} : !torch.vtensor<[8,32],f32>, {{.*}} -> !torch.vtensor<[8,32],f16>
# GPU:         torch.aten.to.dtype {{.*}} : !torch.vtensor<[32,16],si8>, {{.*}} -> !torch.vtensor<[32,16],f32>
# GPU:         torch.aten.mm {{.*}} : !torch.vtensor<[2,32],f16>, !torch.vtensor<[32,8],f16> -> !torch.vtensor<[2,8],f16>
# GPU-NOT:     torch.aten.sum.dim_IntList
# GPU:         return

# GPUSTATS:    "name": "int8-weights"
# GPUSTATS:    "rewrote": 2
# GPUSTATS:    "per-channel int8": 2

# KMM-LABEL:   func.func @main
# KMM:         call @__llmc_gemm_int8_2x1x16(%{{.*}}, %{{.*}}) : (tensor<2x16xf32>, tensor<1x16x32xi8>) -> tensor<2x32xf32>
# KMM:         call @__llmc_gemm_int8_2x1x32(%{{.*}}, %{{.*}}) : (tensor<2x32xf32>, tensor<1x32x32xi8>) -> tensor<2x32xf32>
# KMM:         torch.aten.slice.Tensor {{.*}} -> !torch.vtensor<[2,8],f32>
# KMM-NOT:     torch.aten.mm
# KMM:         flow.dispatch @__llmc_kernels::@gemm_int8
# KMM:         func.call @llmc_gemm_int8(

# KMMSTATS-NOT: "per-channel int8, packed": 1
# KMMSTATS:    "per-channel int8, packed, 1 fixed many-row product(s) as C kernel calls": 2
