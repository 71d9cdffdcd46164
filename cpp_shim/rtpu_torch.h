// Internal declarations shared by the shim's files. The shim registers rtpu
// with PyTorch as the PrivateUse1 device and talks to Rust only through
// include/rtpu.h.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/operator_name.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rtpu.h"

namespace torch {
class Library;
} // namespace torch

namespace rtpu_torch {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
// The dispatch keys of a tpu tensor, and of a kernel call on one.
constexpr c10::DispatchKeySet kKeySet(c10::DispatchKey::PrivateUse1);

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

struct ResultDeleter {
  void operator()(rtpu_op_result* result) const {
    rtpu_op_result_destroy(result);
  }
};
using ResultPtr = std::unique_ptr<rtpu_op_result, ResultDeleter>;

// A tensor for a new-tensor output of an op result (taking its storage
// reference).
at::Tensor new_tensor(const rtpu_op_output& out);

// Output `index` of `result`: a new tpu tensor, no tensor (e.g. a gradient
// that output_mask did not ask for), or the argument it aliases;
// `argument(i)` is argument i's tensor, or null when it is not a tensor.
template <class ArgumentTensor>
at::Tensor take_output(
    const c10::OperatorName& op,
    const rtpu_op_result* result,
    size_t index,
    ArgumentTensor argument) {
  rtpu_op_output out{};
  out.struct_size = RTPU_OP_OUTPUT_STRUCT_SIZE;
  check(rtpu_op_result_get(result, index, &out));
  if (out.alias_of >= 0) {
    const at::Tensor* aliased = argument(static_cast<size_t>(out.alias_of));
    TORCH_CHECK(
        aliased != nullptr,
        "rtpu: ",
        op,
        ": output ",
        index,
        " aliases argument ",
        out.alias_of,
        ", which is not a tensor argument");
    return *aliased;
  }
  if (out.storage == nullptr) {
    return at::Tensor();
  }
  return new_tensor(out);
}

// Calls core op `op` (setting the Python line of a recorded op): its
// result, or null when the core does not lower this call (UNIMPLEMENTED:
// e.g. a complex input to a real-only formula); then `not_lowered` says
// why. Throws on any other error.
ResultPtr call_core_op(
    size_t op,
    const rtpu_op_arg* args,
    size_t count,
    std::string* not_lowered);

// The boxed kernel of core op `core_op`: it takes every call, converting
// the dispatcher's stack, and sends what the core does not lower to the
// CPU.
c10::BoxedKernel core_op_boxed_kernel(size_t core_op);

// A Python number ATen wrapped as a 0-dim CPU tensor, read from its one
// element: `item()` would dispatch a CPU op for every recorded op.
c10::Scalar wrapped_number(const at::Tensor& t);

// The id of a core op by schema name ("aten::copy_"); throws if absent.
size_t op_id(const char* schema_name);

// Runs core op `op` on (dst, src, false) for a same-device copy.
void device_copy(const at::Tensor& dst, const at::Tensor& src);

// ----- typed_kernels.cpp ---------------------------------------------------

// Registers a kernel taking its C++ arguments for `name` ("aten::add.Tensor")
// when it is one of the hot ops that have one, and returns whether it did.
bool register_typed_kernel(
    torch::Library& m,
    const std::string& name,
    size_t core_op,
    const c10::OperatorHandle& op);

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
