# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --dtype bf16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# bf16 on SPIR-V: the program is computed in f32; every weight (a parameter, a buffer) is stored as
# its bf16 bits in an i16 parameter and widened where used: int32(bits) << 16, read as f32.
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return self.lin(x) * self.scale


torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"lin.weight"> : tensor<8x16xi16>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"lin.bias"> : tensor<8xi16>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"scale"> : tensor<8xi16>
# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.__lshift__.Scalar {{.*}} -> !torch.vtensor<[8,16],si32>
# CHECK:       call @__llmc_bitcast_8x16_i32_f32({{.*}}) : (tensor<8x16xi32>) -> tensor<8x16xf32>
# CHECK-NOT:   bf16

# STATS:       "name": "bf16-weights"
# STATS:       "rewrote": 3
