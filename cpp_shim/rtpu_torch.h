// Internal declarations shared by the shim's files. The shim registers rtpu
// with PyTorch as the PrivateUse1 device and talks to Rust only through
// include/rtpu.h.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rtpu.h"

namespace rtpu_torch {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// ----- runtime.cpp ---------------------------------------------------------

// The process's runtime, opened on first use from $RTPU_PLUGIN, else the
// plugin the shim finds itself (runtime.cpp, `plugin_path`). Throws a
// c10::Error when the plugin cannot be opened. Thread-safe.
const rtpu_runtime* runtime();

// The number of devices, or 0 when the runtime cannot be opened. Never throws.
c10::DeviceIndex device_count() noexcept;

// Whether the runtime has been opened (without opening it).
bool runtime_initialized() noexcept;

// Throws a c10::Error carrying `error`'s message (after destroying it) when
// `error` is not NULL.
void check(rtpu_error* error);

// Throws unless `index` names one of the runtime's devices.
void check_device_index(c10::DeviceIndex index);

// ----- dtype.cpp -----------------------------------------------------------

uint32_t to_rtpu_dtype(c10::ScalarType type);
c10::ScalarType from_rtpu_dtype(uint32_t code);

// ----- allocator.cpp -------------------------------------------------------

// The PrivateUse1 allocator (also registered with c10).
c10::DeviceAllocator* allocator();

// A storage of PyTorch wrapping `owned`, whose one reference it takes over;
// counted in the memory statistics like an allocation.
c10::Storage wrap_storage(rtpu_storage* owned);

// The rtpu storage behind a PrivateUse1 storage made by this allocator;
// borrowed, valid while `storage` lives. Throws for foreign storages.
rtpu_storage* storage_handle(const c10::Storage& storage);

// Grows or shrinks a storage in place (same handle), keeping the memory
// statistics consistent.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// The device of a pointer into a storage made by this allocator.
c10::DeviceIndex device_from_ptr(const void* ptr);

// ----- guard.cpp -----------------------------------------------------------

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

// ----- generator.cpp -------------------------------------------------------

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// Seeds every device's default generator, including ones not created yet.
void manual_seed_all(uint64_t seed);
// {seed, offset} for one random op: the given generator (or `device`'s
// default one when absent), whose offset then advances so the next op draws
// different numbers.
std::array<int64_t, 2> next_random_state(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device);

// ----- transfer.cpp --------------------------------------------------------

// A borrowed view of `tensor` (a PrivateUse1 tensor) for one rtpu call: its
// sizes and strides point into the tensor's metadata.
rtpu_tensor_ref tensor_ref(const at::Tensor& tensor);

// Writes the CPU tensor `src` into the device tensor `dst`, converting dtype
// and broadcasting as Tensor.copy_ does.
void copy_host_to_device(const at::Tensor& dst, const at::Tensor& src);

// The elements of the device tensor `src` as a new contiguous CPU tensor of
// its dtype (conjugate and negative bits applied lazily).
at::Tensor copy_device_to_host(const at::Tensor& src);

// A new device tensor on `device` with the values of the CPU tensor `src`.
at::Tensor to_device(const at::Tensor& src, c10::Device device);

// ----- minimal_ops.cpp -----------------------------------------------------

// Schema names ("aten::view") the shim implements itself; the boxed kernel
// never registers these.
const std::unordered_set<std::string>& shim_op_names();

// ----- location.cpp --------------------------------------------------------

// The location id (rtpu_location_intern) of the innermost Python frame
// whose file is not under one of the internal path prefixes; 0 when there is
// no Python frame on this thread.
uint32_t python_location();
void set_internal_paths(const std::vector<std::string>& prefixes);

// ----- boxed_kernel.cpp ----------------------------------------------------

// A tensor for a new-tensor output of an op result (taking its storage
// reference).
at::Tensor new_tensor(const rtpu_op_output& out);

// The id of a core op by schema name ("aten::copy_"); throws if absent.
size_t op_id(const char* schema_name);

// Runs core op `op` on (dst, src, false) for a same-device copy.
void device_copy(const at::Tensor& dst, const at::Tensor& src);

// ----- collectives.cpp -----------------------------------------------------

// All-reduces tensors of one dtype and shape, each on a different tpu
// device of this process, in one XLA program (collectives.cpp); returns
// each device's result.
std::vector<at::Tensor> all_reduce_devices(
    const std::vector<at::Tensor>& tensors,
    const std::string& op);

// ----- fallback.cpp --------------------------------------------------------

// Runs `op` on the CPU: the fallback for ops the core does not implement,
// and for calls it does not lower (`reason` says why; empty for an op with
// no core lowering at all). Warns once per op and counts every call.
void cpu_fallback(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack,
    const std::string& reason = "");

// Ops that ran on the CPU fallback, with their call counts.
std::vector<std::pair<std::string, int64_t>> fallback_counts();

} // namespace rtpu_torch
