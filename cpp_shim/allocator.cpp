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

#include <array>
#include <cstdint>
#include <mutex>
#include <string_view>

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

// Per-device byte and block counts. Every block is its own segment and is
// active, and rtpu asks for exactly what it keeps, so PyTorch's allocated,
// reserved, active and requested bytes are one count, and its allocation,
// segment and active blocks another: a storage's allocation and free move
// two counts, not seven (they run for every tensor an op makes). Leaked on
// purpose: storages may be freed during process teardown, after static
// destructors have run.
struct Stats {
  using Stat = c10::CachingAllocator::Stat;
  struct Counts {
    Stat bytes;
    Stat blocks;
    int64_t allocations = 0;
    int64_t frees = 0;
  };

  std::mutex mutex;
  // Indexed by the device's index as a byte, so that no index reads outside
  // (a device's index is below 128: see `kDeviceShift`).
  std::array<Counts, 256> devices;

  static Stats& get() {
    static Stats* stats = new Stats();
    return *stats;
  }

  void allocated(c10::DeviceIndex device, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& counts = at(device);
    counts.bytes.increase(nbytes);
    counts.blocks.increase(1);
    counts.allocations += 1;
  }

  void freed(c10::DeviceIndex device, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& counts = at(device);
    counts.bytes.decrease(nbytes);
    counts.blocks.decrease(1);
    counts.frees += 1;
  }

  // A storage changed size in place (resize_): only the byte count moves.
  void resized(c10::DeviceIndex device, size_t old_nbytes, size_t new_nbytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& bytes = at(device).bytes;
    if (new_nbytes > old_nbytes) {
      bytes.increase(new_nbytes - old_nbytes);
    } else {
      bytes.decrease(old_nbytes - new_nbytes);
    }
  }

  // PyTorch's view of a device's counts (its "all pools" entries).
  DeviceStats snapshot(c10::DeviceIndex device) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex);
    const auto& counts = at(device);
    DeviceStats s;
    for (auto* bytes : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                        &s.requested_bytes}) {
      (*bytes)[0] = counts.bytes;
    }
    for (auto* blocks : {&s.allocation, &s.segment, &s.active}) {
      (*blocks)[0] = counts.blocks;
    }
    s.num_device_alloc = counts.allocations;
    s.num_device_free = counts.frees;
    return s;
  }

  void reset_peak(c10::DeviceIndex device) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex);
    auto& counts = at(device);
    counts.bytes.reset_peak();
    counts.blocks.reset_peak();
  }

  void reset_accumulated(c10::DeviceIndex device) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex);
    auto& counts = at(device);
    counts.bytes.reset_accumulated();
    counts.blocks.reset_accumulated();
    counts.allocations = 0;
    counts.frees = 0;
  }

 private:
  Counts& at(c10::DeviceIndex device) {
    return devices[static_cast<uint8_t>(device)];
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
