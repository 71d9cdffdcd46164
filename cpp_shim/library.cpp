// torch.ops.rtpu: what the Python package reads from the shim (counters,
// devices, generators), as ordinary ops so the shim needs no Python.

#include "rtpu_torch.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace rtpu_torch {
namespace {

std::tuple<std::vector<std::string>, std::vector<int64_t>> op_fallback_counts() {
  std::tuple<std::vector<std::string>, std::vector<int64_t>> out;
  for (auto& [name, count] : fallback_counts()) {
    std::get<0>(out).push_back(name);
    std::get<1>(out).push_back(count);
  }
  return out;
}

std::vector<int64_t> op_engine_metrics() {
  rtpu_metrics m{};
  m.struct_size = RTPU_METRICS_STRUCT_SIZE;
  check(rtpu_metrics_get(&m));
  return {
      static_cast<int64_t>(m.ops_run),
      static_cast<int64_t>(m.executables_compiled),
      static_cast<int64_t>(m.cache_hits),
      static_cast<int64_t>(m.host_to_device_bytes),
      static_cast<int64_t>(m.device_to_host_bytes),
  };
}

int64_t op_device_count() {
  return device_count();
}

bool op_is_initialized() {
  return runtime_initialized();
}

int64_t op_current_device() {
  return current_device();
}

void op_set_device(int64_t device) {
  set_current_device(static_cast<c10::DeviceIndex>(device));
}

void op_synchronize(int64_t device) {
  // rtpu_op_call and the transfers return once their work is done, so there
  // is nothing to wait for; the index is still checked.
  check_device_index(static_cast<c10::DeviceIndex>(device));
}

std::string op_platform_name() {
  return rtpu_runtime_platform_name(runtime());
}

at::Generator op_default_generator(int64_t device) {
  return default_generator(static_cast<c10::DeviceIndex>(device));
}

void op_manual_seed_all(int64_t seed) {
  manual_seed_all(static_cast<uint64_t>(seed));
}

} // namespace

TORCH_LIBRARY(rtpu, m) {
  m.def(
      "fallback_counts() -> (str[] ops, int[] counts)",
      TORCH_FN(op_fallback_counts));
  // ops_run, executables_compiled, cache_hits, host_to_device_bytes,
  // device_to_host_bytes (the fields of rtpu_metrics, in order).
  m.def("engine_metrics() -> int[]", TORCH_FN(op_engine_metrics));
  m.def("device_count() -> int", TORCH_FN(op_device_count));
  m.def("is_initialized() -> bool", TORCH_FN(op_is_initialized));
  m.def("current_device() -> int", TORCH_FN(op_current_device));
  m.def("set_device(int device) -> ()", TORCH_FN(op_set_device));
  m.def("synchronize(int device) -> ()", TORCH_FN(op_synchronize));
  m.def("platform_name() -> str", TORCH_FN(op_platform_name));
  m.def("default_generator(int device) -> Generator?", TORCH_FN(op_default_generator));
  // The seed is a uint64 passed as int64 bits.
  m.def("manual_seed_all(int seed) -> ()", TORCH_FN(op_manual_seed_all));
}

} // namespace rtpu_torch
