# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | not grep ui8
# X86InductorQuantizer's uint8 activations (zero point 130 in [0, 255]) become int8 with zero point 2
# in [-128, 127] (exact: q_s8 = q_u8 - 128); a 3-D activation's view between the quantize and the
# dequantize (qdq-contractions) becomes int8 too.
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class U8Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (32, 16), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(32) * 0.01)
        self.register_buffer("wz", torch.zeros(32, dtype=torch.int64))

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 130, 0, 255, torch.uint8), 0.05, 130, 0, 255, torch.uint8)
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        return torch.nn.functional.linear(xd, w)


torch.export.save(torch.export.export(U8Linear(), (torch.randn(2, 8, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK-DAG:   %[[ZP:.+]] = torch.constant.int 2{{$}}
# CHECK-DAG:   %[[LO:.+]] = torch.constant.int -128{{$}}
# CHECK-DAG:   %[[HI:.+]] = torch.constant.int 127{{$}}
# CHECK-DAG:   %[[I8:.+]] = torch.constant.int 1{{$}}
# CHECK:       %[[Q:.+]] = torch.quantized_decomposed.quantize_per_tensor %arg0, %{{.+}}, %[[ZP]], %[[LO]], %[[HI]], %[[I8]] : {{.*}} -> !torch.vtensor<[2,8,16],si8>
# CHECK:       %[[V:.+]] = torch.aten.view %[[Q]], {{.*}} -> !torch.vtensor<[16,16],si8>
# CHECK:       torch.quantized_decomposed.dequantize_per_tensor %[[V]], %{{.+}}, %[[ZP]], %[[LO]], %[[HI]], %[[I8]]
