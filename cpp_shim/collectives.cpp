// Collectives over several tpu devices of this process, as torch.cuda.nccl
// runs them over GPUs: one XLA program with a replica per device
// (rtpu_communicator_new_local), no host staging.

#include "rtpu_torch.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>
#include <memory>
#include <mutex>

namespace rtpu_torch {
namespace {

struct WorkDeleter {
  void operator()(rtpu_work* work) const noexcept {
    rtpu_work_destroy(work);
  }
};
using OwnedWork = std::unique_ptr<rtpu_work, WorkDeleter>;

// One communicator per device list, kept for the process (as the runtime
// is): each compiles its programs once per shape and dtype.
const rtpu_communicator* communicator_for(const std::vector<size_t>& devices) {
  static std::mutex mutex;
  static std::map<std::vector<size_t>, rtpu_communicator*> communicators;
  std::lock_guard<std::mutex> lock(mutex);
  rtpu_communicator*& comm = communicators[devices];
  if (comm == nullptr) {
    rtpu_error* error = rtpu_communicator_new_local(
        runtime(), devices.data(), devices.size(), &comm);
    if (error != nullptr) {
      communicators.erase(devices);
      check(error);
    }
  }
  return comm;
}

uint32_t reduce_op_code(const std::string& op) {
  static const std::map<std::string, uint32_t> codes = {
      {"sum", RTPU_REDUCE_SUM},
      {"avg", RTPU_REDUCE_AVG},
      {"min", RTPU_REDUCE_MIN},
      {"max", RTPU_REDUCE_MAX},
      {"prod", RTPU_REDUCE_PROD}};
  const auto found = codes.find(op);
  TORCH_CHECK(
      found != codes.end(),
      "rtpu: all_reduce_devices: op must be sum, avg, min, max or prod, got '",
      op,
      "'");
  return found->second;
}

// The tensor as a collective takes it: contiguous over all of its storage.
at::Tensor dense(const at::Tensor& tensor) {
  const auto bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  if (tensor.is_contiguous() && tensor.storage_offset() == 0 &&
      tensor.storage().nbytes() == bytes) {
    return tensor;
  }
  return tensor.clone(at::MemoryFormat::Contiguous);
}

} // namespace

std::vector<at::Tensor> all_reduce_devices(
    const std::vector<at::Tensor>& tensors,
    const std::string& op) {
  TORCH_CHECK(!tensors.empty(), "rtpu: all_reduce_devices needs at least one tensor");
  const uint32_t reduce_op = reduce_op_code(op);
  std::vector<size_t> devices;
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(
        t.device().type() == c10::DeviceType::PrivateUse1,
        "rtpu: all_reduce_devices takes tpu tensors; tensor ",
        i,
        " is on ",
        t.device());
    TORCH_CHECK(
        t.scalar_type() == tensors[0].scalar_type() && t.sizes() == tensors[0].sizes(),
        "rtpu: all_reduce_devices needs one dtype and shape: tensor 0 is ",
        tensors[0].scalar_type(),
        tensors[0].sizes(),
        ", tensor ",
        i,
        " is ",
        t.scalar_type(),
        t.sizes());
    devices.push_back(static_cast<size_t>(t.device().index()));
    inputs.push_back(dense(t));
  }
  // Inside rtpu.step() the program ends here (counted in collective_splits).
  check(rtpu_engine_split_at_collective());
  const rtpu_communicator* comm = communicator_for(devices);

  // The last rank's start runs the program; every work is then done.
  std::vector<OwnedWork> works;
  for (size_t rank = 0; rank < inputs.size(); ++rank) {
    rtpu_collective_args args{};
    args.struct_size = RTPU_COLLECTIVE_ARGS_STRUCT_SIZE;
    args.collective = RTPU_COLLECTIVE_ALL_REDUCE;
    args.reduce_op = reduce_op;
    args.rank = rank;
    args.input = tensor_ref(inputs[rank]);
    rtpu_work* work = nullptr;
    check(rtpu_collective_start(comm, &args, &work));
    works.emplace_back(work);
  }
  std::vector<at::Tensor> results;
  const auto strides = c10::contiguous_strides(inputs[0].sizes());
  for (size_t rank = 0; rank < works.size(); ++rank) {
    rtpu_storage* output = nullptr;
    constexpr uint64_t kTimeoutMs = 10 * 60 * 1000;
    check(rtpu_work_wait(works[rank].get(), kTimeoutMs, &output));
    rtpu_op_output out{};
    out.struct_size = RTPU_OP_OUTPUT_STRUCT_SIZE;
    out.storage = output;
    out.dtype = to_rtpu_dtype(inputs[rank].scalar_type());
    out.ndim = inputs[rank].dim();
    out.sizes = inputs[rank].sizes().data();
    out.strides = strides.data();
    out.storage_offset = 0;
    results.push_back(new_tensor(out));
  }
  return results;
}

} // namespace rtpu_torch
