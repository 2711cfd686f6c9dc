// RUN: llmc-opt %s --pass log10-to-log | filecheck %s
// RUN: llmc-opt %s --pipeline --target cpu | filecheck %s
// The pipeline line fails if log10-to-log leaves the cpu pipeline (compiler/pipeline.py).

// CHECK-LABEL: func.func @f32_and_dynamic
// CHECK-NOT:     torch.aten.log10
// CHECK:         %[[LOG:.+]] = torch.aten.log %arg0 : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
// CHECK:         %[[LN10:.+]] = torch.constant.float 2.30258
// CHECK:         %[[DIV:.+]] = torch.aten.div.Scalar %[[LOG]], %[[LN10]] : !torch.vtensor<[4,?],f32>, !torch.float -> !torch.vtensor<[4,?],f32>
// CHECK:         return %[[DIV]]
func.func @f32_and_dynamic(%arg0: !torch.vtensor<[4,?],f32>) -> !torch.vtensor<[4,?],f32> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
  return %0 : !torch.vtensor<[4,?],f32>
}

// CHECK-LABEL: func.func @bf16_two_uses
// CHECK-NOT:     torch.aten.log10
// CHECK:         %[[LOG:.+]] = torch.aten.log %arg0 : !torch.vtensor<[8],bf16>
// CHECK:         %[[DIV:.+]] = torch.aten.div.Scalar %[[LOG]]
// CHECK:         torch.aten.mul.Tensor %[[DIV]], %[[DIV]]
func.func @bf16_two_uses(%arg0: !torch.vtensor<[8],bf16>) -> !torch.vtensor<[8],bf16> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[8],bf16> -> !torch.vtensor<[8],bf16>
  %1 = torch.aten.mul.Tensor %0, %0 : !torch.vtensor<[8],bf16>, !torch.vtensor<[8],bf16> -> !torch.vtensor<[8],bf16>
  return %1 : !torch.vtensor<[8],bf16>
}

// An integer operand is converted to the result's float type first, as torch promotes it.
// CHECK-LABEL: func.func @int_operand
// CHECK-NOT:     torch.aten.log10
// CHECK:         %[[F:.+]] = torch.aten.to.dtype %arg0, %int6, %false, %false, %none : !torch.vtensor<[4,?],si32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,?],f32>
// CHECK:         %[[LOG:.+]] = torch.aten.log %[[F]] : !torch.vtensor<[4,?],f32> -> !torch.vtensor<[4,?],f32>
// CHECK:         %[[DIV:.+]] = torch.aten.div.Scalar %[[LOG]], %{{.+}} : !torch.vtensor<[4,?],f32>, !torch.float -> !torch.vtensor<[4,?],f32>
// CHECK:         return %[[DIV]]
func.func @int_operand(%arg0: !torch.vtensor<[4,?],si32>) -> !torch.vtensor<[4,?],f32> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[4,?],si32> -> !torch.vtensor<[4,?],f32>
  return %0 : !torch.vtensor<[4,?],f32>
}

// CHECK-LABEL: func.func @bool_operand_f64_result
// CHECK:         torch.aten.to.dtype %arg0, %int7, {{.*}} : !torch.vtensor<[3],i1>, {{.*}} -> !torch.vtensor<[3],f64>
// CHECK:         torch.aten.log {{.*}} -> !torch.vtensor<[3],f64>
func.func @bool_operand_f64_result(%arg0: !torch.vtensor<[3],i1>) -> !torch.vtensor<[3],f64> {
  %0 = torch.aten.log10 %arg0 : !torch.vtensor<[3],i1> -> !torch.vtensor<[3],f64>
  return %0 : !torch.vtensor<[3],f64>
}
