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
  const uint64_t fields[] = {
      m.ops_run,          m.ops_recorded,        m.executables_compiled,
      m.cache_hits,       m.disk_cache_hits,     m.graph_executions,
      m.recompiles,       m.record_ns,           m.compile_ns,
      m.execute_ns,       m.wait_ns,             m.host_to_device_bytes,
      m.device_to_host_bytes, m.live_buffers, m.buffers_donated,
  };
  return std::vector<int64_t>(std::begin(fields), std::end(fields));
}

void op_set_deferred(bool deferred) {
  check(rtpu_engine_set_mode(deferred ? RTPU_MODE_DEFERRED : RTPU_MODE_EAGER));
}

bool op_is_deferred() {
  return rtpu_engine_mode() == RTPU_MODE_DEFERRED;
}

void op_flush(const std::string& site) {
  check(rtpu_engine_flush(site.empty() ? nullptr : site.c_str()));
}

void op_set_explain_recompiles(bool on) {
  rtpu_engine_set_explain_recompiles(on);
}

void op_set_recompile_limit(int64_t limit) {
  rtpu_engine_set_recompile_limit(limit);
}

void op_set_internal_paths(std::vector<std::string> prefixes) {
  set_internal_paths(prefixes);
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
  check_device_index(static_cast<c10::DeviceIndex>(device));
  check(rtpu_engine_synchronize());
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
  // The fields of rtpu_metrics, in the order of op_engine_metrics.
  m.def("engine_metrics() -> int[]", TORCH_FN(op_engine_metrics));
  m.def("set_deferred(bool deferred) -> ()", TORCH_FN(op_set_deferred));
  m.def("is_deferred() -> bool", TORCH_FN(op_is_deferred));
  // site: where the flush was asked for ("" for the current op's line).
  m.def("flush(str site) -> ()", TORCH_FN(op_flush));
  m.def("set_explain_recompiles(bool on) -> ()", TORCH_FN(op_set_explain_recompiles));
  // A negative limit removes it.
  m.def("set_recompile_limit(int limit) -> ()", TORCH_FN(op_set_recompile_limit));
  // Python files under these prefixes are not the user's line.
  m.def("set_internal_paths(str[] prefixes) -> ()", TORCH_FN(op_set_internal_paths));
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
