// torch.autocast("tpu"): CUDA's casting policy on the AutocastPrivateUse1
// key, built from ATen's own op lists so it follows PyTorch's as they
// change. Ops in none of the lists run in the dtypes they are given.

#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// ATen's op lists name signatures' types (Tensor, Scalar, DimnameList, ...)
// as code inside namespace at would.
using namespace at;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // Matmuls and convolutions in the autocast dtype.
#define RTPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(RTPU_LOWER_PRECISION)
#undef RTPU_LOWER_PRECISION
  // Softmax, losses, norms and reductions that need range in float32.
#define RTPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(RTPU_FP32)
#undef RTPU_FP32
#define RTPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(RTPU_FP32_SET_OPT_DTYPE)
#undef RTPU_FP32_SET_OPT_DTYPE
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  // Ops mixing inputs run in the widest of their dtypes.
#define RTPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(RTPU_PROMOTE)
#undef RTPU_PROMOTE
}

} // namespace
