// RUN: llmc-opt %s --pass bitcast-elementwise | filecheck %s
// An 8-bit view (int8 -> float8, a native fp8 decode of a parameter) and a view between different
// widths are left alone.

// CHECK-LABEL: func.func @keep
// CHECK:       torch.aten.view.dtype %arg0, {{.*}} -> !torch.vtensor<[4],f8E4M3FN>
// CHECK:       torch.aten.view.dtype %arg1, {{.*}} -> !torch.vtensor<[4],f16>
// CHECK-NOT:   call @__llmc_bitcast
func.func @keep(%arg0: !torch.vtensor<[4],si8>, %arg1: !torch.vtensor<[2],si32>) -> (!torch.vtensor<[4],f8E4M3FN>, !torch.vtensor<[4],f16>) {
  %int24 = torch.constant.int 24
  %int5 = torch.constant.int 5
  %0 = torch.aten.view.dtype %arg0, %int24 : !torch.vtensor<[4],si8>, !torch.int -> !torch.vtensor<[4],f8E4M3FN>
  %1 = torch.aten.view.dtype %arg1, %int5 : !torch.vtensor<[2],si32>, !torch.int -> !torch.vtensor<[4],f16>
  return %0, %1 : !torch.vtensor<[4],f8E4M3FN>, !torch.vtensor<[4],f16>
}
