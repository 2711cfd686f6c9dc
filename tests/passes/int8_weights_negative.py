# RUN: %python %s %t.pt2
# RUN: env LLMC_CPU_KERNELS=off llmc-opt %t.pt2 --pipeline --target cpu --dtype int8 --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --dtype fp8 --stats 2> %t.fp8.stats | filecheck %s --check-prefix=WITHFP8
# RUN: filecheck %s --check-prefix=SKIPPED < %t.fp8.stats
# Left in f32: an embedding table (quantized only with the quant_embeddings option), a 1-d weight
# (a norm), and a buffer the program writes. Only the linear weight becomes int8 (4 rows: packed
# on cpu as one group of 8, padded with zero rows; without the C kernels, whose groups are 32 channels
# where a C compiler is found). Under --dtype fp8 the int8 pass does not run
# (and the fp8 pass stores no `_int8_scale`).
import sys

import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 16)
        self.norm = torch.nn.RMSNorm(16)
        self.lin = torch.nn.Linear(16, 4, bias=False)
        self.register_buffer("seen", torch.zeros(4, 16))

    def forward(self, ids):
        h = self.norm(self.emb(ids))
        self.seen.add_(h[:, :1].sum(0))
        return self.lin(h)


torch.export.save(torch.export.export(M(), (torch.tensor([[1, 2, 3, 4]]),)), sys.argv[1])

# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"emb.weight"> : tensor<10x16xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"norm.weight"> : tensor<16xf32>
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"seen"> : tensor<4x16xf32>, is_mutable
# CHECK-DAG:   "util.global"() {initial_value = #stream.parameter.named<"model"::"lin.weight"> : tensor<1x16x8xi8>
# CHECK-NOT:   emb.weight_int8_scale

# STATS:       "name": "int8-weights"
# STATS:       "rewrote": 1
# STATS:       "declined": 1
# STATS:       "embedding table (set quant_embeddings to quantize it)"

# WITHFP8-NOT: _int8_scale
# WITHFP8:     "model"::"lin.weight_fp8_scale"
# WITHFP8-NOT: _int8_scale

# SKIPPED:     "name": "fp8-weights"
# SKIPPED:     "rewrote": 1
# SKIPPED:     "skipped"
# SKIPPED:     "name": "int8-weights"
# SKIPPED-NEXT: "reason": "needs dtype int8, compiling fp8"
