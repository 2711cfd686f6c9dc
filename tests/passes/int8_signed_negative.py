# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu | filecheck %s
# Left as uint8: a quantized tensor the program also returns (its values are visible), and a pair whose
# dequantize uses other parameters than its quantize.
import sys

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401

qd = torch.ops.quantized_decomposed


class Kept(torch.nn.Module):
    def forward(self, x):
        q = qd.quantize_per_tensor(x, 0.05, 130, 0, 255, torch.uint8)
        q2 = qd.quantize_per_tensor(x, 0.05, 120, 0, 255, torch.uint8)
        d2 = qd.dequantize_per_tensor(q2, 0.1, 120, 0, 255, torch.uint8)
        return q, qd.dequantize_per_tensor(q, 0.05, 130, 0, 255, torch.uint8) + d2


torch.export.save(torch.export.export(Kept(), (torch.randn(4, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.quantized_decomposed.quantize_per_tensor %arg0, {{.*}} -> !torch.vtensor<[4,16],ui8>
# CHECK:       torch.quantized_decomposed.quantize_per_tensor %arg0, {{.*}} -> !torch.vtensor<[4,16],ui8>
# CHECK-NOT:   si8
