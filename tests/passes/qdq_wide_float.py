# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# An int8 conv with an int32-quantized bias and an int32 result (torch-mlir's e2e Conv2dQInt8Module): on cpu
# the int32 dequantize of the bias and the int32 quantize of the result become f32 math, the int8 operands
# stay Q/DQ for IREE's integer lowering.
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class QConv(torch.nn.Module):
    def forward(self, x, w, b):
        x = qd.dequantize_per_tensor(x, 0.01, 7, -128, 127, torch.int8)
        w = qd.dequantize_per_tensor(w, 0.01, 3, -128, 127, torch.int8)
        b = qd.dequantize_per_tensor(b, 1.0, 0, -1000, 1000, torch.int32)
        return qd.quantize_per_tensor(torch.nn.functional.conv2d(x, w, b), 1.0, 0, -(2**31), 2**31 - 1, torch.int32)


args = (torch.randint(-128, 127, (1, 3, 8, 8), dtype=torch.int8), torch.randint(-128, 127, (4, 3, 3, 3), dtype=torch.int8),
        torch.randint(-1000, 1000, (4,), dtype=torch.int32))
torch.export.save(torch.export.export(QConv(), args), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.to.dtype %arg2, {{.*}} -> !torch.vtensor<[4],f32>
# CHECK:       torch.aten.convolution {{.*}} -> !torch.vtensor<[1,4,6,6],f32>
# CHECK:       torch.aten.round
# CHECK:       torch.aten.clamp
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[1,4,6,6],si32>
# STATS:       "name": "qdq-wide-float"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "dequantize per tensor": 1,
# STATS-NEXT:  "quantize per tensor": 1
