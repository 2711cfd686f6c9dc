# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target vulkan --dtype bf16 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target hip --arch gfx942 --dtype bf16 --stats 2>&1 >/dev/null | filecheck %s --check-prefix=HIP
# A buffer the program writes is state, not a weight: it stays f32 (the program's compute dtype)
# while the read-only weight is stored as bf16 bits. On hip (native bf16 math) the pass does not run.
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))
        self.register_buffer("w", torch.ones(4))

    def forward(self, x):
        self.count.add_(x)
        return x * self.w


torch.export.save(torch.export.export(M(), (torch.randn(4),)), sys.argv[1])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"count"> : tensor<4xf32>, is_mutable
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"w"> : tensor<4xi16>

# STATS:       "name": "bf16-weights"
# STATS:       "rewrote": 1
# STATS:       "declined": 1
# STATS:       "mutated by the program

# HIP:         "skipped": [
# HIP:         "name": "bf16-weights"
# HIP-NEXT:    "reason": "needs backend vulkan-spirv/llvm-cpu, target hip uses rocm"
