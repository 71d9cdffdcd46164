module @relu {
  func.func public @main(%x: tensor<2x2xf64>) -> (tensor<2x2xf64>, tensor<2x2xi1>) {
    %zero = stablehlo.constant dense<0.0> : tensor<2x2xf64>
    %gt = stablehlo.compare GT, %x, %zero, FLOAT : (tensor<2x2xf64>, tensor<2x2xf64>) -> tensor<2x2xi1>
    %0 = stablehlo.select %gt, %x, %zero : tensor<2x2xi1>, tensor<2x2xf64>
    return %0, %gt : tensor<2x2xf64>, tensor<2x2xi1>
  }
}
