# RUN: %python %s %t.pt2
# RUN: llmc-opt %t.pt2 --pipeline --target cpu --stats 2> %t.stats | filecheck %s
# RUN: filecheck %s --check-prefix=STATS < %t.stats
# Average pooling of an unbatched (C, H, W) input runs on x.unsqueeze(0); with ceil_mode and
# count_include_pad=False, the windows' sums over an explicitly padded input are divided by the sums of ones.
import sys

import torch


class Pools(torch.nn.Module):
    def forward(self, x, y):
        return (torch.nn.functional.avg_pool2d(x, [6, 8], [2, 2]),
                torch.nn.functional.avg_pool2d(y, [3, 2], [2, 3], ceil_mode=True, count_include_pad=False))


torch.export.save(torch.export.export(Pools(), (torch.rand(4, 20, 20), torch.rand(1, 1, 3, 4))), sys.argv[1])

# CHECK-LABEL: func.func @main
# CHECK:       torch.aten.unsqueeze %arg0, %int0 : {{.*}} -> !torch.vtensor<[1,4,20,20],f32>
# CHECK:       torch.aten.avg_pool2d {{.*}} -> !torch.vtensor<[1,4,8,7],f32>
# CHECK:       torch.aten.squeeze.dim {{.*}} -> !torch.vtensor<[4,8,7],f32>
# H 3, window 3, stride 2: 1 row; W 4, window 2, stride 3: 2 columns, the second past W by 1.
# CHECK:       torch.aten.constant_pad_nd %arg1, {{.*}} -> !torch.vtensor<[1,1,3,5],f32>
# CHECK:       torch.aten.avg_pool2d {{.*}}, %false, %true, %int1 : {{.*}} -> !torch.vtensor<[1,1,1,2],f32>
# CHECK:       torch.aten.avg_pool2d {{.*}}, %false, %true, %int1 : {{.*}} -> !torch.vtensor<[1,1,1,2],f32>
# CHECK:       torch.aten.div.Tensor
# STATS:       "name": "avg-pool-forms"
# STATS:       "rewrote": 2
# STATS:       "forms": {
# STATS-NEXT:  "ceil-exclude-pad": 1,
# STATS-NEXT:  "unbatched": 1
