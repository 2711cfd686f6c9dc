# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | not grep torch.aten.convolution
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan | filecheck %s --check-prefix=SPIRV
# On llvm-cpu a PT2E conv2d becomes im2col + matmul on the int8 tensors: the int8 input padded with
# its zero point (5), unfolded into 3x3 windows, copied to [N*Ho*Wo, C*9] and dequantized; the int8
# weight viewed [O, C*9] and dequantized per channel; their matmul (the bias added after). IREE's own im2col would
# run before its Q/DQ rewrite and leave an f32 matmul. Other targets keep the convolution (IREE forms
# an i8 x i8 -> i32 convolution there).
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class QConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (8, 4, 3, 3), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(8) * 0.01)
        self.register_buffer("wz", torch.zeros(8, dtype=torch.int64))
        self.b = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 5, -128, 127, torch.int8), 0.05, 5, -128, 127, torch.int8)
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        return torch.nn.functional.conv2d(xd, w, self.b, stride=2, padding=1)


torch.export.save(torch.export.export(QConv(), (torch.randn(2, 4, 8, 8),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       %[[Q:.+]] = torch.quantized_decomposed.quantize_per_tensor %arg0, %{{[^,]+}}, %[[ZP:[^,]+]], {{.*}} -> !torch.vtensor<[2,4,8,8],si8>
# CHECK:       %[[P:.+]] = torch.aten.constant_pad_nd %[[Q]], %{{.+}}, %[[ZP]] : {{.*}} -> !torch.vtensor<[2,4,10,10],si8>
# CHECK:       %[[U:.+]] = torch.aten.unfold %[[P]], {{.*}} -> !torch.vtensor<[2,4,4,10,3],si8>
# CHECK:       torch.aten.unfold %[[U]], {{.*}} -> !torch.vtensor<[2,4,4,4,3,3],si8>
# CHECK:       %[[COLS:.+]] = torch.aten.view {{.*}} -> !torch.vtensor<[32,36],si8>
# CHECK:       %[[A:.+]] = torch.quantized_decomposed.dequantize_per_tensor %[[COLS]]
# CHECK:       %[[W:.+]] = torch.aten.view {{.*}} : !torch.vtensor<[8,4,3,3],si8>, !torch.list<int> -> !torch.vtensor<[8,36],si8>
# CHECK:       %[[WD:.+]] = torch.quantized_decomposed.dequantize_per_channel %[[W]]
# CHECK:       %[[WT:.+]] = torch.aten.permute %[[WD]]
# CHECK:       torch.aten.mm %[[A]], %[[WT]]
# SPIRV:       torch.aten.convolution
