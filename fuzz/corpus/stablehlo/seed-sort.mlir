module @sort {
  func.func public @main(%x: tensor<8xf16>) -> tensor<8xf16> {
    %0 = "stablehlo.sort"(%x) ({
    ^bb0(%a: tensor<f16>, %b: tensor<f16>):
      %lt = stablehlo.compare LT, %a, %b, FLOAT : (tensor<f16>, tensor<f16>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    }) {dimension = 0 : i64, is_stable = true} : (tensor<8xf16>) -> tensor<8xf16>
    return %0 : tensor<8xf16>
  }
}
