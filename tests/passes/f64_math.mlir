// RUN: llmc-opt %s --pass f64-math --stats 2> %t.stats | filecheck %s
// RUN: filecheck %s --check-prefix=STATS < %t.stats
// RUN: llmc-opt %s --pipeline --target cpu | filecheck %s
// RUN: llmc-opt %s --pipeline --target hip | filecheck %s --check-prefix=GPU
// The cpu pipeline line fails if f64-math leaves the cpu pipeline (compiler/pipeline.py); GPU
// targets keep f64 trigonometry (their device libraries have it).
// f64 trigonometry becomes a call to a private elementwise function (one per function and shape)
// written in f64 arith: Cody-Waite reduction by pi/2, fdlibm's kernels, the quadrant by selects.

// CHECK-LABEL: func.func @trig
// CHECK-NOT:     torch.aten.cos
// CHECK:         %[[B:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[4,?],f64>) -> tensor<4x?xf64>
// CHECK:         %[[C:.+]] = call @__llmc_f64_cos_4xD(%[[B]]) : (tensor<4x?xf64>) -> tensor<4x?xf64>
// CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[C]]) : (tensor<4x?xf64>) -> !torch.vtensor<[4,?],f64>
// CHECK:         %[[B2:.+]] = "torch_c.to_builtin_tensor"(%[[T]])
// CHECK:         call @__llmc_f64_cos_4xD(%[[B2]])
// An int32 operand of atan2 is converted to f64 first, as torch promotes it.
// CHECK:         %[[Y:.+]] = torch.aten.to.dtype %arg1, %int7, %false, %false, %none : !torch.vtensor<[4,?],si32>, {{.*}} -> !torch.vtensor<[4,?],f64>
// CHECK:         %[[YB:.+]] = "torch_c.to_builtin_tensor"(%[[Y]])
// CHECK:         call @__llmc_f64_atan2_4xD(%[[YB]], %{{.+}}) : (tensor<4x?xf64>, tensor<4x?xf64>) -> tensor<4x?xf64>
// polar: the [1,?] magnitude broadcast to the result's shape (times ones), then one call making complex<f64>.
// CHECK:         %[[ONES:.+]] = torch.aten.ones_like %arg0
// CHECK:         %[[R:.+]] = torch.aten.mul.Tensor %arg2, %[[ONES]] : !torch.vtensor<[1,?],f64>, !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],f64>
// CHECK:         %[[P:.+]] = call @__llmc_f64_polar_4xD(%{{.+}}, %{{.+}}) : (tensor<4x?xf64>, tensor<4x?xf64>) -> tensor<4x?xcomplex<f64>>
// CHECK:         "torch_c.from_builtin_tensor"(%[[P]]) : (tensor<4x?xcomplex<f64>>) -> !torch.vtensor<[4,?],complex<f64>>
func.func @trig(%arg0: !torch.vtensor<[4,?],f64>, %arg1: !torch.vtensor<[4,?],si32>, %arg2: !torch.vtensor<[1,?],f64>) -> (!torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],complex<f64>>) {
  %0 = torch.aten.cos %arg0 : !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],f64>
  %1 = torch.aten.cos %0 : !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],f64>
  %2 = torch.aten.atan2 %arg1, %arg0 : !torch.vtensor<[4,?],si32>, !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],f64>
  %3 = torch.aten.polar %arg2, %arg0 : !torch.vtensor<[1,?],f64>, !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],complex<f64>>
  return %0, %1, %2, %3 : !torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],f64>, !torch.vtensor<[4,?],complex<f64>>
}

// CHECK-LABEL: func.func @others
// CHECK-NOT:     torch.aten.
// CHECK:         call @__llmc_f64_sin_scalar
// CHECK:         call @__llmc_f64_tan_scalar
// CHECK:         call @__llmc_f64_asin_scalar
// CHECK:         call @__llmc_f64_acos_scalar
// CHECK:         call @__llmc_f64_atan_scalar
// CHECK:         call @__llmc_f64_tanh_scalar
// CHECK:         call @__llmc_f64_log2_scalar
// CHECK-NOT:     torch.aten.
// CHECK:         return
func.func @others(%arg0: !torch.vtensor<[],f64>) -> (!torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>) {
  %0 = torch.aten.sin %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %1 = torch.aten.tan %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %2 = torch.aten.asin %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %3 = torch.aten.acos %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %4 = torch.aten.atan %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %5 = torch.aten.tanh %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  %6 = torch.aten.log2 %arg0 : !torch.vtensor<[],f64> -> !torch.vtensor<[],f64>
  return %0, %1, %2, %3, %4, %5, %6 : !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>, !torch.vtensor<[],f64>
}

// One function per function and shape: cos is defined once for its two uses.
// CHECK-LABEL: func.func private @__llmc_f64_cos_4xD(%arg0: tensor<4x?xf64>) -> tensor<4x?xf64>
// CHECK:         tensor.dim %arg0, %c1
// CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "parallel"]
// k = roundeven(x * 2/pi), then x - k * pi/2 in pieces (pi/2's first 26 bits: 1.5707963407039642)
// CHECK:         arith.constant 0.63661977236758138 : f64
// CHECK:         math.roundeven
// CHECK:         arith.constant 1.5707963407039642 : f64
// CHECK-NOT:     math.cos
// CHECK-NOT:     math.sin
// CHECK:         linalg.yield
// CHECK-LABEL: func.func private @__llmc_f64_atan2_4xD(%arg0: tensor<4x?xf64>, %arg1: tensor<4x?xf64>) -> tensor<4x?xf64>
// CHECK-NOT:     math.atan
// CHECK:         linalg.yield
// CHECK-LABEL: func.func private @__llmc_f64_polar_4xD
// CHECK:         complex.create {{.*}} : complex<f64>
// CHECK-LABEL: func.func private @__llmc_f64_sin_scalar(%arg0: tensor<f64>) -> tensor<f64>
// CHECK:         tensor.empty() : tensor<f64>
// CHECK-NOT:     func.func private @__llmc_f64_cos_4xD

// STATS:       "name": "f64-math"
// STATS:       "matched": 11
// STATS-NEXT:  "rewrote": 11
// STATS-NEXT:  "declined": 0
// STATS:       "forms": {
// STATS-NEXT:  "acos": 1,
// STATS-NEXT:  "asin": 1,
// STATS-NEXT:  "atan": 1,
// STATS-NEXT:  "atan2": 1,
// STATS-NEXT:  "cos": 2,
// STATS-NEXT:  "log2": 1,
// STATS-NEXT:  "polar": 1,
// STATS-NEXT:  "sin": 1,
// STATS-NEXT:  "tan": 1,
// STATS-NEXT:  "tanh": 1

// GPU-LABEL: func.func @trig
// GPU:         torch.aten.cos %arg0 : !torch.vtensor<[4,?],f64> -> !torch.vtensor<[4,?],f64>
// GPU:         torch.aten.atan2 %arg1, %arg0
// GPU:         torch.aten.polar %arg2, %arg0
// GPU-NOT:     __llmc_f64
