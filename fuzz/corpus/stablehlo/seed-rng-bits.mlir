module @bits {
  func.func public @main(%s: tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>) {
    %0:2 = stablehlo.rng_bit_generator %s, algorithm = THREE_FRY : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)
    return %0#0, %0#1 : tensor<2xui64>, tensor<4xui32>
  }
}
