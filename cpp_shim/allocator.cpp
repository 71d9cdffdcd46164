// The PrivateUse1 allocator: every storage is an rtpu storage. The DataPtr's
// context is the rtpu_storage handle; its pointer value is a synthetic id
// (the handle's address tagged with the device index) that is never
// dereferenced. Storages are not cached, so reserved memory equals allocated
// (the CPU plugin's host cache is process-wide: see emptyCache).

#include "rtpu_torch.h"

#include <c10/core/Allocator.h>
#include <c10/core/AutogradState.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>

#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace rtpu_torch {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;

// Synthetic pointers carry `device index + 1` above the 48 bits that user
// space addresses use, so the device of any pointer into a storage (base +
// byte offset) is known without a lookup.
constexpr int kDeviceShift = 48;
static_assert(sizeof(uintptr_t) == 8, "rtpu needs 64-bit pointers");

void* synthetic_ptr(rtpu_storage* storage, c10::DeviceIndex device) {
  const auto bits = reinterpret_cast<uintptr_t>(storage);
  TORCH_INTERNAL_ASSERT(
      bits >> kDeviceShift == 0, "rtpu: storage handle above 2^48");
  return reinterpret_cast<void*>(
      bits | (static_cast<uintptr_t>(device + 1) << kDeviceShift));
}

// Calls `f` on every statistic of `s` that has a peak and a total.
template <typename F>
void for_each_stat(DeviceStats& s, F f) {
  for (auto* array : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                      &s.requested_bytes, &s.allocation, &s.segment,
                      &s.active}) {
    for (auto& stat : *array) {
      f(stat);
    }
  }
}

// Per-device byte counts. Leaked on purpose: storages may be freed during
// process teardown, after static destructors have run.
struct Stats {
  std::mutex mutex;
  std::unordered_map<c10::DeviceIndex, DeviceStats> devices;

  static Stats& get() {
    static Stats* stats = new Stats();
    return *stats;
  }

  void allocated(c10::DeviceIndex device, size_t nbytes) {
    count(device, nbytes, /*allocation=*/true);
  }

  void freed(c10::DeviceIndex device, size_t nbytes) {
    count(device, nbytes, /*allocation=*/false);
  }

  // One allocation (or free) of `nbytes`: the byte and block counts move
  // together, since every block is its own segment and is active.
  void count(c10::DeviceIndex device, size_t nbytes, bool allocation) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = devices[device];
    auto move = [allocation](c10::CachingAllocator::Stat& stat, size_t amount) {
      allocation ? stat.increase(amount) : stat.decrease(amount);
    };
    for (auto* bytes : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                        &s.requested_bytes}) {
      move((*bytes)[0], nbytes);
    }
    for (auto* blocks : {&s.allocation, &s.segment, &s.active}) {
      move((*blocks)[0], 1);
    }
    (allocation ? s.num_device_alloc : s.num_device_free) += 1;
  }

  // A storage changed size in place (resize_): only byte counts move.
  void resized(c10::DeviceIndex device, size_t old_nbytes, size_t new_nbytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = devices[device];
    for (auto* array : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                        &s.requested_bytes}) {
      if (new_nbytes > old_nbytes) {
        (*array)[0].increase(new_nbytes - old_nbytes);
      } else {
        (*array)[0].decrease(old_nbytes - new_nbytes);
      }
    }
  }

  DeviceStats snapshot(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex);
    return devices[device];
  }

  void reset_peak(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex);
    for_each_stat(devices[device], [](auto& stat) { stat.reset_peak(); });
  }

  void reset_accumulated(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = devices[device];
    for_each_stat(s, [](auto& stat) { stat.reset_accumulated(); });
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }
};

c10::DeviceIndex device_of(const rtpu_storage* storage) {
  return static_cast<c10::DeviceIndex>(rtpu_storage_device_index(storage));
}

void delete_storage(void* context) {
  auto* storage = static_cast<rtpu_storage*>(context);
  Stats::get().freed(device_of(storage), rtpu_storage_nbytes(storage));
  rtpu_storage_release(storage);
}

// Autograd hands the backward of a device's tensors to a thread of its own
// and waits for it. rtpu's ops only launch programs (or record them in a
// step), so the hand-off is pure cost: on a small model it was most of a
// compiled step's host time. A thread's first tpu storage made outside a
// backward pass therefore turns autograd's multithreading off for that
// thread, once: threads that never touch a tpu tensor keep PyTorch's
// default, and a later `torch.autograd.set_multithreading_enabled(True)` on
// this thread stands. Inside a backward pass (on autograd's own thread) the
// setting in force is the pass's, which must not change halfway.
void run_backward_on_this_thread() {
  thread_local bool done = false;
  if (!done && torch::autograd::get_current_graph_task_id() == -1) {
    done = true;
    c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
  }
}

c10::DataPtr make_data_ptr(rtpu_storage* owned) {
  run_backward_on_this_thread();
  const auto device = device_of(owned);
  Stats::get().allocated(device, rtpu_storage_nbytes(owned));
  return c10::DataPtr(
      synthetic_ptr(owned, device),
      owned,
      &delete_storage,
      c10::Device(kDevice, device));
}

struct RtpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const auto device = current_device();
    rtpu_storage* storage = nullptr;
    check(rtpu_storage_new(
        runtime(), static_cast<size_t>(device), nbytes, &storage));
    return make_data_ptr(storage);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    // Storages are handles, never raw memory.
    return nullptr;
  }

  void copy_data(void*, const void*, size_t) const override {
    TORCH_CHECK(
        false,
        "rtpu: tpu storages are device handles and cannot be copied with "
        "memcpy; copy tensors instead (Tensor.copy_)");
  }

  bool initialized() override {
    // Statistics are kept from the first allocation on.
    return true;
  }

  void emptyCache(c10::MempoolId_t) override {
    // Freed storages return to the device at once; what the CPU plugin's
    // host cache keeps of their memory goes back to the system here.
    uint64_t released = 0;
    check(rtpu_host_cache_release(&released));
  }

  void recordStream(const c10::DataPtr&, c10::Stream) override {
    // One stream per device: nothing to track.
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return Stats::get().snapshot(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    Stats::get().reset_accumulated(device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    Stats::get().reset_peak(device);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    rtpu_device_info info{};
    info.struct_size = RTPU_DEVICE_INFO_STRUCT_SIZE;
    check(rtpu_runtime_device_info(
        runtime(), static_cast<size_t>(device), &info));
    if (!info.has_memory_stats && std::string_view(info.kind) == "cpu") {
      // The CPU plugin keeps no statistics, and its devices' memory is the
      // host's.
      const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      return {
          static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
          static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
    }
    TORCH_CHECK_NOT_IMPLEMENTED(
        info.has_memory_stats && info.bytes_limit >= 0,
        "rtpu: the plugin keeps no memory statistics for tpu:",
        static_cast<int>(device));
    const auto limit = static_cast<size_t>(info.bytes_limit);
    const auto used = static_cast<size_t>(info.bytes_in_use);
    return {limit > used ? limit - used : 0, limit};
  }
};

RtpuAllocator* g_allocator = new RtpuAllocator();

struct Register {
  Register() {
    c10::SetAllocator(kDevice, g_allocator);
  }
} g_register;

} // namespace

c10::DeviceAllocator* allocator() {
  return g_allocator;
}

c10::Storage wrap_storage(rtpu_storage* owned) {
  const size_t nbytes = rtpu_storage_nbytes(owned);
  return c10::Storage(
      c10::Storage::use_byte_size_t(),
      nbytes,
      make_data_ptr(owned),
      g_allocator,
      /*resizable=*/true);
}

rtpu_storage* storage_handle(const c10::Storage& storage) {
  TORCH_CHECK(
      storage.device_type() == kDevice,
      "rtpu: expected a tpu storage, got one on ",
      storage.device());
  const c10::DataPtr& data_ptr = storage.data_ptr();
  TORCH_CHECK(
      data_ptr.get_deleter() == &delete_storage,
      "rtpu: this tpu storage was not allocated by rtpu (e.g. made by "
      "from_blob); rtpu can only use storages it allocated");
  return static_cast<rtpu_storage*>(data_ptr.get_context());
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(
      storage.resizable(), "Trying to resize storage that is not resizable");
  rtpu_storage* handle = storage_handle(storage);
  const size_t old_nbytes = rtpu_storage_nbytes(handle);
  check(rtpu_storage_resize(handle, nbytes));
  Stats::get().resized(device_of(handle), old_nbytes, nbytes);
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

c10::DeviceIndex device_from_ptr(const void* ptr) {
  const auto tag = reinterpret_cast<uintptr_t>(ptr) >> kDeviceShift;
  TORCH_CHECK(
      tag >= 1 && tag <= 128,
      "rtpu: ",
      ptr,
      " is not a pointer into a tpu storage");
  return static_cast<c10::DeviceIndex>(tag - 1);
}

} // namespace rtpu_torch
