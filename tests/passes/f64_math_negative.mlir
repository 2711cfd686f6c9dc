// RUN: llmc-opt %s --pass f64-math --stats 2> %t.stats | filecheck %s
// RUN: filecheck %s --check-prefix=STATS < %t.stats

// f32 and f16 trigonometry are left alone (IREE's llvm-cpu approximates them by polynomials itself),
// and so is log10 (log10-to-log's).
// CHECK-LABEL: func.func @narrow
// CHECK:         torch.aten.sin %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
// CHECK:         torch.aten.atan2 %arg0, %arg0 : {{.*}} -> !torch.vtensor<[4],f32>
// CHECK:         torch.aten.cos %arg1 : !torch.vtensor<[4],f16> -> !torch.vtensor<[4],f16>
// CHECK:         torch.aten.log10 %arg2 : !torch.vtensor<[4],f64> -> !torch.vtensor<[4],f64>
// CHECK-NOT:     call @__llmc_f64
func.func @narrow(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],f16>, %arg2: !torch.vtensor<[4],f64>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f16>, !torch.vtensor<[4],f64>) {
  %0 = torch.aten.sin %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.atan2 %arg0, %arg0 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.cos %arg1 : !torch.vtensor<[4],f16> -> !torch.vtensor<[4],f16>
  %3 = torch.aten.log10 %arg2 : !torch.vtensor<[4],f64> -> !torch.vtensor<[4],f64>
  return %0, %1, %2, %3 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f16>, !torch.vtensor<[4],f64>
}

// complex<f64> sin is declined (IREE expands complex math through its complex dialect).
// CHECK-LABEL: func.func @complex_operand
// CHECK:         torch.aten.sin %arg0 : !torch.vtensor<[4],complex<f64>> -> !torch.vtensor<[4],complex<f64>>
// CHECK-NOT:     func.func private @__llmc_f64
func.func @complex_operand(%arg0: !torch.vtensor<[4],complex<f64>>) -> !torch.vtensor<[4],complex<f64>> {
  %0 = torch.aten.sin %arg0 : !torch.vtensor<[4],complex<f64>> -> !torch.vtensor<[4],complex<f64>>
  return %0 : !torch.vtensor<[4],complex<f64>>
}

// STATS: "name": "f64-math"
// STATS: "matched": 1
// STATS: "rewrote": 0
// STATS: "declined": 1
// STATS: "complex<f64> operand"
