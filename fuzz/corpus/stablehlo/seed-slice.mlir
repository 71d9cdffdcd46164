module @slices {
  func.func public @main(%x: tensor<4x4xi64>) -> tensor<2x4xi64> {
    %0 = stablehlo.slice %x [1:3, 0:4] : (tensor<4x4xi64>) -> tensor<2x4xi64>
    %1 = stablehlo.transpose %0, dims = [0, 1] : (tensor<2x4xi64>) -> tensor<2x4xi64>
    return %1 : tensor<2x4xi64>
  }
}
