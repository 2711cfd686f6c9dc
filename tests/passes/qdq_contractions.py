# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target hip | filecheck %s
# RUN: llmc-opt %t.pt2 --pass qdq-contractions --stats 2>&1 >/dev/null | filecheck %s --check-prefix=STATS
# A PT2E linear on a 3-D activation: the decomposed program reads dequantize -> view -> mm, which IREE
# runs in f32. After qdq-contractions the view is applied to the int8 tensor and the mm reads the
# dequantize itself (IREE then forms an i8 x i8 -> i32 matmul); the weight's per-channel dequantize
# behind its transpose is left as it is.
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class QLinear3d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (32, 16), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(32) * 0.01)
        self.register_buffer("wz", torch.zeros(32, dtype=torch.int64))

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8), 0.05, 3, -128, 127, torch.int8)
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        return torch.nn.functional.linear(xd, w)


torch.export.save(torch.export.export(QLinear3d(), (torch.randn(2, 8, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       %[[Q:.+]] = torch.quantized_decomposed.quantize_per_tensor %arg0, {{.*}} -> !torch.vtensor<[2,8,16],si8>
# CHECK:       %[[W:.+]] = torch.quantized_decomposed.dequantize_per_channel
# CHECK:       %[[WT:.+]] = torch.aten.permute %[[W]]
# CHECK:       %[[V:.+]] = torch.aten.view %[[Q]], {{.*}} -> !torch.vtensor<[16,16],si8>
# CHECK:       %[[D:.+]] = torch.quantized_decomposed.dequantize_per_tensor %[[V]], {{.*}} -> !torch.vtensor<[16,16],f32>
# CHECK:       torch.aten.mm %[[D]], %[[WT]]
# CHECK-NOT:   quantized_decomposed
# STATS: "name": "qdq-contractions"
# STATS: "rewrote": 1
