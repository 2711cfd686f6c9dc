// RUN: llmc-opt %s --pass log10-to-log --stats 2> %t.stats | filecheck %s
// RUN: filecheck %s --check-prefix=STATS < %t.stats
// RUN: llmc-opt %s --pipeline --target hip | filecheck %s --check-prefix=GPU

// Complex operands are declined; other log ops are untouched.
// CHECK-LABEL: func.func @complex_operand
// CHECK:         torch.aten.log10 %arg0 : !torch.vtensor<[4],complex<f32>> -> !torch.vtensor<[4],complex<f32>>
// CHECK-NOT:     torch.aten.div.Scalar
func.func @complex_operand(%arg0: !torch.vtensor<[4],complex<f32>>) -> !torch.vtensor<[4],complex<f32>> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[4],complex<f32>> -> !torch.vtensor<[4],complex<f32>>
  return %0 : !torch.vtensor<[4],complex<f32>>
}

// CHECK-LABEL: func.func @plain_log
// CHECK:         torch.aten.log %arg0
// CHECK-NOT:     torch.aten.div.Scalar
func.func @plain_log(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.log %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// STATS: "name": "log10-to-log"
// STATS: "matched": 1
// STATS: "rewrote": 0
// STATS: "declined": 1

// Not on GPU targets: their libraries have log10 (the pass is skipped there).
// GPU-LABEL: func.func @complex_operand
// GPU-LABEL: func.func @plain_log
// GPU-NOT:     torch.aten.div.Scalar
