# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --dtype bf16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --dtype bf16 | filecheck %s --check-prefix=VK
# bf16 on cpu computes in f32 (bf16 weights); the f32 output goes back to bf16 at the end, as eager
# bf16 returns it. The integer output is left alone. SPIR-V has no bf16: vulkan returns f32. (Kernels off:
# the product stays an mm here; with them it is llmc's many-row kernel, bf16_weights_cpu.py.)
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = self.lin(x)
        return y, y.argmax(-1)


torch.export.save(torch.export.export(M(), (torch.randn(2, 16),)), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.mm {{.*}} -> !torch.vtensor<[2,8],f32>
# CHECK:       torch.aten.to.dtype {{.*}} -> !torch.vtensor<[2,8],bf16>
# CHECK:       return {{.*}} : !torch.vtensor<[2,8],bf16>, !torch.vtensor<[2],si64>

# STATS:       "name": "bf16-outputs"
# STATS:       "rewrote": 1

# VK-LABEL:    func.func @main
# VK-NOT:      bf16
# VK:          return {{.*}} : !torch.vtensor<[2,8],f32>, !torch.vtensor<[2],si64>
