module @add_one {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %x, %one : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
