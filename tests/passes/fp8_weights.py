# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --dtype fp8 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx942 --dtype fp8 | filecheck %s --check-prefix=FNUZ
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx950 --dtype fp8 | filecheck %s --check-prefix=FN
# Both linear weights become 1-byte parameters with an f32 scale per output row. cpu has no fp8
# arithmetic: the codes are decoded with three integer ops (shifted to the top byte, shifted back
# arithmetically into an f32's places and masked; times 2^120 folded into the scale) and the
# matmul runs in f32. gfx942 decodes natively from E4M3FNUZ, gfx950 from E4M3FN, in f16.
import sys

import torch

m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
torch.export.save(torch.export.export(m, (torch.randn(2, 16),)), sys.argv[1])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight"> : tensor<32x16xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.weight_fp8_scale"> : tensor<32x1xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"2.weight"> : tensor<8x32xi8>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"0.bias"> : tensor<32xf32>
# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.__lshift__.Scalar {{.*}} -> !torch.vtensor<[32,16],si32>
# CHECK-NOT:   torch.aten.bitwise_or
# CHECK:       torch.aten.__rshift__.Scalar {{.*}} -> !torch.vtensor<[32,16],si32>
# CHECK:       torch.aten.bitwise_and.Scalar {{.*}} -> !torch.vtensor<[32,16],si32>
# CHECK-NOT:   torch.aten.bitwise_or
# CHECK:       call @__llmc_bitcast_32x16_i32_f32({{.*}}) : (tensor<32x16xi32>) -> tensor<32x16xf32>
# CHECK:       torch.aten.mul.Tensor {{.*}} !torch.vtensor<[32,16],f32>, !torch.vtensor<[32,1],f32> -> !torch.vtensor<[32,16],f32>
# CHECK-NOT:   f8E4M3

# STATS:       "name": "fp8-weights"
# STATS:       "rewrote": 2
# STATS:       "per-channel software": 2

# FNUZ:        torch.aten.view.dtype {{.*}} -> !torch.vtensor<[32,16],f8E4M3FNUZ>
# FNUZ:        torch.aten.to.dtype {{.*}} -> !torch.vtensor<[32,16],f16>
# FN:          torch.aten.view.dtype {{.*}} -> !torch.vtensor<[32,16],f8E4M3FN>
