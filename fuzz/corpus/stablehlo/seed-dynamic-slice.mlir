module @dyn {
  func.func public @main(%x: tensor<6xi16>, %i: tensor<i64>) -> tensor<2xi16> {
    %0 = stablehlo.dynamic_slice %x, %i, sizes = [2] : (tensor<6xi16>, tensor<i64>) -> tensor<2xi16>
    %1 = stablehlo.dynamic_update_slice %x, %0, %i : (tensor<6xi16>, tensor<2xi16>, tensor<i64>) -> tensor<6xi16>
    return %0 : tensor<2xi16>
  }
}
