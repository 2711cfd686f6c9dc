# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# Left alone: a matmul whose operand is dequantized through an elementwise op (not a layout op:
# relu(dequant(q)) is not dequant(relu(q)) unless the zero point is the range's minimum).
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        xd = qd.dequantize_per_tensor(qd.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8), 0.05, 3, -128, 127, torch.int8)
        return torch.relu(xd) @ self.w


torch.export.save(torch.export.export(Mixed(), (torch.randn(4, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       %[[Q:.+]] = torch.quantized_decomposed.quantize_per_tensor %arg0
# CHECK:       %[[D:.+]] = torch.quantized_decomposed.dequantize_per_tensor %[[Q]]
# CHECK:       %[[R:.+]] = torch.aten.relu %[[D]]
# CHECK:       torch.aten.mm %[[R]]
