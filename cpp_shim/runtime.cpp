// The one rtpu runtime of the process, opened lazily from the plugin
// `plugin_path` finds.

#include "rtpu_torch.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

namespace rtpu_torch {
namespace {

std::mutex g_open_mutex;
std::atomic<const rtpu_runtime*> g_runtime{nullptr};

// Set in a child forked after the runtime opened: PJRT's threads do not
// survive fork, so the inherited runtime would wait on them for ever.
std::atomic<bool> g_forked_child{false};

void mark_forked_child() {
  if (g_runtime.load(std::memory_order_relaxed) != nullptr) {
    g_forked_child.store(true, std::memory_order_relaxed);
  }
}

const int g_atfork_registered = pthread_atfork(nullptr, nullptr, mark_forked_child);

namespace fs = std::filesystem;

// The file of the loaded library that holds `symbol`, as it was loaded (not
// resolved through links).
fs::path library_of(const void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  return info.dli_fname;
}

// The PJRT plugin to open, so a C++ program needs no environment: in order,
// 1. $RTPU_PLUGIN, when set (a missing file is then the core's error);
// 2. the path in `plugin-path` beside this library, which scripts/build-shim
//    writes: the CPU plugin of the Python environment the shim was built in;
// 3. PyPI xla-cpu-pjrt's plugin in the site-packages that holds the torch
//    this process loaded (site-packages/torch/lib/libc10.so).
// When none exists, the error names each place tried.
std::string plugin_path() {
  const char* env = std::getenv("RTPU_PLUGIN");
  if (env != nullptr && env[0] != '\0') {
    return env;
  }
  std::vector<std::string> tried = {"$RTPU_PLUGIN (unset)"};
  auto found = [&tried](const fs::path& path, const std::string& what) {
    std::error_code error;
    if (!path.empty() && fs::is_regular_file(path, error)) {
      return true;
    }
    tried.push_back(path.string() + " (" + what + ": missing)");
    return false;
  };

  const fs::path record =
      library_of(reinterpret_cast<const void*>(&plugin_path)).parent_path() /
      "plugin-path";
  std::string recorded;
  std::getline(std::ifstream(record), recorded);
  if (recorded.empty()) {
    tried.push_back(record.string() + " (no plugin recorded at build time)");
  } else if (found(recorded, "recorded at build time in " + record.string())) {
    return recorded;
  }

  const fs::path site_packages =
      library_of(reinterpret_cast<const void*>(&c10::GetCPUAllocator))
          .parent_path()
          .parent_path()
          .parent_path();
  const fs::path beside_torch =
      site_packages / "xla_plugins" / "xla_cpu_pjrt" / "xla_cpu_pjrt.so";
  if (found(beside_torch, "xla-cpu-pjrt beside torch")) {
    return beside_torch.string();
  }
  TORCH_CHECK(
      false,
      "rtpu: no PJRT plugin found. Tried, in order: ",
      c10::Join("; ", tried),
      ". Install XLA's CPU plugin (pip install xla-cpu-pjrt) into torch's "
      "environment, or set RTPU_PLUGIN to a PJRT plugin (.so).");
}

// The CPU plugin's device memory is this process's heap. By default glibc
// hands a freed buffer of a few megabytes back to the system (munmap, or a
// trim of the heap's top), and the next step's program faults the same
// pages in again, zeroed: a step-mode MLP step varied between 11 and 15 ms
// with that, 10.8-11.4 ms without. Fixed thresholds keep freed buffers in
// the heap for the next step, as a caching allocator keeps device memory;
// RTPU_CPU_HEAP_CACHE=0 leaves glibc's defaults.
void keep_freed_cpu_device_memory(const rtpu_runtime* rt) {
#ifdef __GLIBC__
  const char* setting = std::getenv("RTPU_CPU_HEAP_CACHE");
  if ((setting != nullptr && std::string(setting) == "0") ||
      std::string(rtpu_runtime_platform_name(rt)) != "cpu") {
    return;
  }
  // Below 32 MiB (glibc's largest mmap threshold) from the heap; the heap
  // is trimmed only past 512 MiB free at its top.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#else
  (void)rt;
#endif
}

} // namespace

void check(rtpu_error* error) {
  if (error == nullptr) {
    return;
  }
  const uint32_t code = rtpu_error_code(error);
  std::string message = rtpu_error_message(error);
  rtpu_error_destroy(error);
  TORCH_CHECK_NOT_IMPLEMENTED(
      code != RTPU_ERROR_CODE_UNIMPLEMENTED, "rtpu: ", message);
  // torch.OutOfMemoryError, as CUDA raises.
  TORCH_CHECK_WITH(
      OutOfMemoryError, code != RTPU_ERROR_CODE_RESOURCE_EXHAUSTED, "rtpu: ", message);
  TORCH_CHECK(false, "rtpu: ", message);
}

const rtpu_runtime* runtime() {
  TORCH_CHECK(
      !g_forked_child.load(std::memory_order_relaxed),
      "rtpu: cannot use tpu in a forked subprocess: the parent process opened "
      "the device runtime, which does not survive fork. Use "
      "torch.multiprocessing with the 'spawn' start method (as with CUDA), "
      "e.g. DataLoader(multiprocessing_context='spawn'), or keep tpu work in "
      "the parent.");
  if (const rtpu_runtime* rt = g_runtime.load(std::memory_order_acquire)) {
    return rt;
  }
  std::lock_guard<std::mutex> lock(g_open_mutex);
  if (const rtpu_runtime* rt = g_runtime.load(std::memory_order_acquire)) {
    return rt;
  }
  TORCH_CHECK(
      rtpu_abi_version() == RTPU_ABI_VERSION,
      "rtpu: librtpu.so has ABI version ",
      rtpu_abi_version(),
      " but librtpu_torch.so was built against ",
      RTPU_ABI_VERSION,
      "; rebuild the shim (scripts/build-shim)");
  const std::string plugin = plugin_path();
  rtpu_runtime_open_args args{};
  args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE;
  args.plugin_path = plugin.c_str();
  // RTPU_CPU_DEVICES=N: the CPU plugin's devices per process (its own
  // default otherwise), e.g. one per torchrun rank, or 8 to try a mesh.
  rtpu_named_value cpu_devices{};
  if (const char* text = std::getenv("RTPU_CPU_DEVICES"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long long count = std::strtoll(text, &end, 10);
    TORCH_CHECK(
        *end == '\0' && count > 0,
        "rtpu: RTPU_CPU_DEVICES must be a positive device count, got '",
        text,
        "'");
    cpu_devices.name = "cpu_device_count";
    cpu_devices.value_type = RTPU_VALUE_INT64;
    cpu_devices.int64_value = count;
    args.options = &cpu_devices;
    args.num_options = 1;
  }
  rtpu_runtime* rt = nullptr;
  check(rtpu_runtime_open(&args, &rt));
  keep_freed_cpu_device_memory(rt);
  // Never released: storages and generators may outlive any owner we could
  // name, and the plugin stays loaded for the process anyway.
  g_runtime.store(rt, std::memory_order_release);
  return rt;
}

bool runtime_initialized() noexcept {
  return g_runtime.load(std::memory_order_acquire) != nullptr;
}

c10::DeviceIndex device_count() noexcept {
  try {
    return static_cast<c10::DeviceIndex>(
        rtpu_runtime_device_count(runtime()));
  } catch (...) {
    return 0;
  }
}

void check_device_index(c10::DeviceIndex index) {
  const auto count = rtpu_runtime_device_count(runtime());
  TORCH_CHECK(
      index >= 0 && static_cast<size_t>(index) < count,
      "rtpu: device index ",
      static_cast<int>(index),
      " is out of range; there are ",
      count,
      " tpu devices");
}

} // namespace rtpu_torch
