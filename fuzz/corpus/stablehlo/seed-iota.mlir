module @iota {
  func.func public @main() -> tensor<3x4xui8> {
    %0 = stablehlo.iota dim = 1 : tensor<3x4xui8>
    return %0 : tensor<3x4xui8>
  }
  func.func private @unused(%c: tensor<ui8>) -> tensor<ui8> {
    return %c : tensor<ui8>
  }
}
