module @casts {
  func.func public @main(%x: tensor<6xi32>) -> tensor<2x3xbf16> {
    %0 = stablehlo.convert %x : (tensor<6xi32>) -> tensor<6xbf16>
    %1 = stablehlo.reshape %0 : (tensor<6xbf16>) -> tensor<2x3xbf16>
    return %1 : tensor<2x3xbf16>
  }
}
