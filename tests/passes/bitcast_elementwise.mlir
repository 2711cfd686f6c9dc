// RUN: llmc-opt %s --pass bitcast-elementwise | filecheck %s
// A same-width view.dtype (the end of the fp8/bf16 weight decodes) becomes a call to a private
// elementwise bitcast function, one per shape and type pair, that IREE inlines and fuses.

// CHECK-LABEL: func.func @decode
// CHECK-NOT:   torch.aten.view.dtype
// CHECK:       %[[B:.*]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[4,?],si32>) -> tensor<4x?xi32>
// CHECK:       %[[C:.*]] = call @__llmc_bitcast_4xD_i32_f32(%[[B]]) : (tensor<4x?xi32>) -> tensor<4x?xf32>
// CHECK:       "torch_c.from_builtin_tensor"(%[[C]]) : (tensor<4x?xf32>) -> !torch.vtensor<[4,?],f32>
// CHECK:       call @__llmc_bitcast_4xD_i32_f32
// CHECK:       call @__llmc_bitcast_3_i16_f16
// CHECK-LABEL: func.func private @__llmc_bitcast_4xD_i32_f32(%arg0: tensor<4x?xi32>) -> tensor<4x?xf32>
// CHECK:       tensor.dim %arg0, %c1
// CHECK:       linalg.generic
// CHECK:       arith.bitcast %{{.*}} : i32 to f32
// CHECK-LABEL: func.func private @__llmc_bitcast_3_i16_f16
// CHECK:       arith.bitcast %{{.*}} : i16 to f16
func.func @decode(%arg0: !torch.vtensor<[4,?],si32>, %arg1: !torch.vtensor<[3],si16>) -> (!torch.vtensor<[4,?],f32>, !torch.vtensor<[4,?],f32>, !torch.vtensor<[3],f16>) {
  %int6 = torch.constant.int 6
  %int5 = torch.constant.int 5
  %0 = torch.aten.view.dtype %arg0, %int6 : !torch.vtensor<[4,?],si32>, !torch.int -> !torch.vtensor<[4,?],f32>
  %1 = torch.aten.view.dtype %arg0, %int6 : !torch.vtensor<[4,?],si32>, !torch.int -> !torch.vtensor<[4,?],f32>
  %2 = torch.aten.view.dtype %arg1, %int5 : !torch.vtensor<[3],si16>, !torch.int -> !torch.vtensor<[3],f16>
  return %0, %1, %2 : !torch.vtensor<[4,?],f32>, !torch.vtensor<[4,?],f32>, !torch.vtensor<[3],f16>
}
