// ATen ops rtpu implements as short compositions of core ops, where the op
// draws randomness without a Generator argument of its own.

#include "rtpu_torch.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <tuple>

namespace rtpu_torch {
namespace {

// ATen's CPU native_dropout, on tpu: a Bernoulli mask from the device's
// default generator (bernoulli_ runs on the core), then one scaled multiply.
std::tuple<at::Tensor, at::Tensor> native_dropout(
    const at::Tensor& input,
    double p,
    std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input)};
  }
  const auto bool_options = input.options().dtype(at::kBool);
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, bool_options)};
  }
  const double keep = 1.0 - p;
  // A zero keep probability gives zeros, not NaN from 0 * inf.
  const double scale = keep == 0.0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input, bool_options);
  mask.bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", &native_dropout);
}

}  // namespace rtpu_torch
