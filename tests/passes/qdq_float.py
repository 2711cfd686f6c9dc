# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --arch valhall4 | filecheck %s
# RUN: llmc-opt %t.pt2 --pass qdq-float | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --arch valhall4 | not grep -E "si64|quantized_decomposed"
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s --check-prefix=INTEGER
# On an arch without int64 (Mali valhall4) Q/DQ is written out as float math: quantize as
# clamp(round(x * (1/s)) + zp, qmin, qmax) -> int8, dequantize as (float(q) - zp) * s, the per-channel
# zero points stored as f32 (no int64 tensor left). cpu keeps the Q/DQ ops for IREE's integer lowering.
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class QLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (32, 16), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(32) * 0.01)
        self.register_buffer("wz", torch.zeros(32, dtype=torch.int64))

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8), 0.05, 3, -128, 127, torch.int8)
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        return torch.nn.functional.linear(xd, w)


torch.export.save(torch.export.export(QLinear(), (torch.randn(4, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       %[[X:.+]] = torch.aten.mul.Scalar %arg0, %{{.+}} : !torch.vtensor<[4,16],f32>
# CHECK:       %[[R:.+]] = torch.aten.round %[[X]]
# CHECK:       %[[A:.+]] = torch.aten.add.Scalar %[[R]]
# CHECK:       %[[C:.+]] = torch.aten.clamp %[[A]]
# CHECK:       %[[Q:.+]] = torch.aten.to.dtype %[[C]], {{.*}} -> !torch.vtensor<[4,16],si8>
# CHECK:       %[[QF:.+]] = torch.aten.to.dtype %[[Q]], {{.*}} -> !torch.vtensor<[4,16],f32>
# CHECK:       %[[S:.+]] = torch.aten.sub.Scalar %[[QF]]
# CHECK:       torch.aten.mul.Scalar %[[S]]
# CHECK:       torch.aten.sub.Tensor {{.*}} : !torch.vtensor<[32,16],f32>, !torch.vtensor<[32,1],f32>
# CHECK:       torch.aten.mm
# INTEGER:     torch.quantized_decomposed.dequantize_per_channel
