// The CPU fallback for ops the core does not implement, and for calls it
// does not lower: never silent. Each op warns once and is counted
// (rtpu.metrics()["cpu_fallbacks"]).

#include "rtpu_torch.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <map>
#include <mutex>

namespace rtpu_torch {
namespace {

// Leaked: ops may run during teardown.
struct Counts {
  std::mutex mutex;
  std::map<std::string, int64_t> by_op;

  static Counts& get() {
    static Counts* counts = new Counts();
    return *counts;
  }
};

std::string display_name(const c10::OperatorName& op) {
  return op.overload_name.empty() ? op.name
                                  : op.name + "." + op.overload_name;
}

void unimplemented_op_fallback(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack) {
  cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&unimplemented_op_fallback>());
}

} // namespace

void cpu_fallback(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack,
    const std::string& reason) {
  const std::string name = display_name(op.operator_name());
  bool first = false;
  {
    auto& counts = Counts::get();
    std::lock_guard<std::mutex> lock(counts.mutex);
    first = counts.by_op[name]++ == 0;
  }
  if (first) {
    TORCH_WARN(
        "rtpu: ",
        reason.empty() ? name + " is not implemented on tpu" : reason,
        ", so it runs on the CPU (its tensors are copied there and back). "
        "This warning is shown once per op.");
  }
  at::native::cpu_fallback(op, stack);
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  auto& counts = Counts::get();
  std::lock_guard<std::mutex> lock(counts.mutex);
  return {counts.by_op.begin(), counts.by_op.end()};
}

} // namespace rtpu_torch
