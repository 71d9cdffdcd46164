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

using Metrics = std::tuple<
    std::vector<std::string>,
    std::vector<std::string>,
    std::vector<std::string>,
    std::vector<int64_t>>;

Metrics op_metrics() {
  const size_t count = rtpu_metric_count();
  std::vector<uint64_t> values(count);
  check(rtpu_metrics_read(values.data(), count));
  Metrics out;
  auto& [names, units, help, counts] = out;
  for (size_t i = 0; i < count; i++) {
    const char* name = nullptr;
    const char* unit = nullptr;
    const char* line = nullptr;
    check(rtpu_metric_describe(i, &name, &unit, &line));
    names.emplace_back(name);
    units.emplace_back(unit);
    help.emplace_back(line);
    counts.push_back(static_cast<int64_t>(values[i]));
  }
  return out;
}

std::tuple<std::string, int64_t, int64_t, int64_t> op_cache_info() {
  rtpu_cache_info info{};
  info.struct_size = RTPU_CACHE_INFO_STRUCT_SIZE;
  check(rtpu_cache_get_info(&info));
  rtpu_bytes* dir = nullptr;
  check(rtpu_cache_dir(&dir));
  std::string path(reinterpret_cast<const char*>(rtpu_bytes_data(dir)), rtpu_bytes_size(dir));
  rtpu_bytes_destroy(dir);
  return {path, static_cast<int64_t>(info.entries), static_cast<int64_t>(info.bytes),
          static_cast<int64_t>(info.max_bytes)};
}

int64_t op_clear_cache() {
  uint64_t removed = 0;
  check(rtpu_cache_clear(&removed));
  return static_cast<int64_t>(removed);
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

void op_split_at_collective() {
  check(rtpu_engine_split_at_collective());
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

// The device's kind, description and core count (-1 when the plugin does
// not report one, as the CPU plugin does not).
std::tuple<std::string, std::string, int64_t> op_device_info(int64_t device) {
  check_device_index(static_cast<c10::DeviceIndex>(device));
  rtpu_device_info info{};
  info.struct_size = RTPU_DEVICE_INFO_STRUCT_SIZE;
  check(rtpu_runtime_device_info(
      runtime(), static_cast<size_t>(device), &info));
  bool found = false;
  int64_t cores = -1;
  check(rtpu_runtime_device_int_attribute(
      runtime(), static_cast<size_t>(device), "num_cores", &found, &cores));
  return {info.kind, info.description, found ? cores : -1};
}

at::Generator op_default_generator(int64_t device) {
  return default_generator(static_cast<c10::DeviceIndex>(device));
}

std::vector<at::Tensor> op_all_reduce_devices(std::vector<at::Tensor> tensors, std::string op) {
  return all_reduce_devices(tensors, op);
}

void op_manual_seed_all(int64_t seed) {
  manual_seed_all(static_cast<uint64_t>(seed));
}

} // namespace

TORCH_LIBRARY(rtpu, m) {
  m.def(
      "fallback_counts() -> (str[] ops, int[] counts)",
      TORCH_FN(op_fallback_counts));
  // Every metric the core declares: its name, unit, help line and value.
  m.def(
      "metrics() -> (str[] names, str[] units, str[] help, int[] values)",
      TORCH_FN(op_metrics));
  // The disk cache: its directory ("" when off), entries, bytes and cap.
  m.def(
      "cache_info() -> (str dir, int entries, int bytes, int max_bytes)",
      TORCH_FN(op_cache_info));
  m.def("clear_cache() -> int", TORCH_FN(op_clear_cache));
  m.def("set_deferred(bool deferred) -> ()", TORCH_FN(op_set_deferred));
  m.def("is_deferred() -> bool", TORCH_FN(op_is_deferred));
  // site: where the flush was asked for ("" for the current op's line).
  m.def("flush(str site) -> ()", TORCH_FN(op_flush));
  // Before a collective staged through the host: ends the step's program.
  m.def("split_at_collective() -> ()", TORCH_FN(op_split_at_collective));
  m.def("all_reduce_devices(Tensor[] tensors, str op) -> Tensor[]", TORCH_FN(op_all_reduce_devices));
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
  // The device's kind ("TPU v5 lite", "cpu") and description.
  m.def(
      "device_info(int device) -> (str kind, str description, int cores)",
      TORCH_FN(op_device_info));
  m.def("default_generator(int device) -> Generator?", TORCH_FN(op_default_generator));
  // The seed is a uint64 passed as int64 bits.
  m.def("manual_seed_all(int seed) -> ()", TORCH_FN(op_manual_seed_all));
}

} // namespace rtpu_torch
