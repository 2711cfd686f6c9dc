# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target hip | filecheck %s --check-prefix=GPU
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s --check-prefix=CPU
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# GPU targets keep SDPA whole (IREE fuses it): the pass is skipped. On cpu, a one-row query that is
# causal (PyTorch aligns the causal mask top-left: row 0 sees key 0 only) is not a decode step: it
# takes the causal form; a multi-row query with a float mask takes the general form.
import sys

import torch
import torch.nn.functional as F


class Attn(torch.nn.Module):
    def forward(self, q1, k, v, q3, mask):
        return (F.scaled_dot_product_attention(q1, k, v, is_causal=True),
                F.scaled_dot_product_attention(q3, k, v, attn_mask=mask))


args = (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8), torch.zeros(1, 1, 3, 5))
torch.export.save(torch.export.export(Attn(), args), sys.argv[1])

# GPU-LABEL: func.func @main
# GPU:       torch.aten.scaled_dot_product_attention %arg0, %arg1, %arg2

# CPU-LABEL: func.func @main
# CPU-NOT:   scaled_dot_product
# CPU:       torch.aten.bmm

# STATS:       "name": "decompose-attention"
# STATS:       "forms": {
# STATS-NEXT:  "causal": 1
# STATS-NEXT:  "general": 1
# STATS-NEXT:  }
