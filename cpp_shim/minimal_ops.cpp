// The ops every PrivateUse1 device implements itself: allocation, views
// (ATen's own metadata-only kernels), resizing, copies across devices,
// reading a scalar, set_, and whether Module.to may swap a parameter's data
// in place. Everything numeric goes to the core.

#include "rtpu_torch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <unordered_set>

namespace rtpu_torch {
namespace {

void check_tensor_options(
    c10::Device device,
    std::optional<c10::Layout> layout,
    std::optional<bool> pin_memory) {
  TORCH_INTERNAL_ASSERT(device.type() == kDevice);
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "rtpu: tpu tensors are strided; layout ",
      c10::layout_or_default(layout),
      " is not supported");
  TORCH_CHECK(
      !c10::pinned_memory_or_default(pin_memory),
      "rtpu: only CPU memory can be pinned");
}

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device target = c10::device_or_default(device);
  check_tensor_options(target, layout, pin_memory);
  const c10::DeviceGuard guard(target);
  return at::detail::empty_generic(
      size,
      allocator(),
      kKeySet,
      c10::dtype_or_default(dtype),
      memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  const c10::Device target = c10::device_or_default(device);
  check_tensor_options(target, layout, pin_memory);
  const c10::DeviceGuard guard(target);
  return at::detail::empty_strided_generic(
      size, stride, allocator(), kKeySet, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride,
    std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(
      self,
      C10_AS_INTARRAYREF_SLOW(size),
      C10_AS_INTARRAYREF_SLOW(stride),
      offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(
    const at::Tensor& self,
    int64_t dimension,
    int64_t size,
    int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor view_as_real(const at::Tensor& self) {
  return at::native::view_as_real(self);
}

at::Tensor view_as_complex(const at::Tensor& self) {
  return at::native::view_as_complex(self);
}

// ATen's maybe_resize_storage_cpu, growing the rtpu storage in place instead
// of allocating and memcpy-ing.
void maybe_resize_storage(c10::TensorImpl* self, int64_t nbytes) {
  if (self->numel() == 0) {
    return;
  }
  const c10::Storage& storage = self->unsafe_storage();
  TORCH_INTERNAL_ASSERT(storage, "rtpu: a tpu tensor without storage");
  if (static_cast<size_t>(nbytes) > storage.nbytes()) {
    resize_storage_bytes(storage, static_cast<size_t>(nbytes));
  }
}

// ATen's resize_impl_cpu_ with rtpu storages.
void resize_impl(
    c10::TensorImpl* self,
    c10::IntArrayRef size,
    at::OptionalIntArrayRef stride,
    bool resize_storage) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) {
    return;
  }
  const auto itemsize = self->dtype().itemsize();
  const auto offset = self->storage_offset();
  int64_t nbytes = 0;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    nbytes = static_cast<int64_t>(
        at::detail::computeStorageNbytes(size, *stride, itemsize, offset));
  } else {
    self->set_sizes_contiguous(size);
    nbytes = static_cast<int64_t>(
        at::detail::computeStorageNbytesContiguous(size, itemsize, offset));
  }
  if (resize_storage) {
    maybe_resize_storage(self, nbytes);
  }
}

const at::Tensor& resize_(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!self.has_names(), "rtpu: resize_ of named tensors is not supported");
  auto* impl = self.unsafeGetTensorImpl();
  resize_impl(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt, true);
  if (memory_format.has_value()) {
    TORCH_CHECK(
        *memory_format != c10::MemoryFormat::Preserve,
        "Unsupported memory format",
        *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor copy_from(
    const at::Tensor& self,
    const at::Tensor& dst,
    bool non_blocking) {
  (void)non_blocking; // every copy completes before it returns
  TORCH_CHECK(self.defined(), "rtpu: _copy_from: source is undefined");
  TORCH_CHECK(dst.defined(), "rtpu: _copy_from: destination is undefined");
  const bool from_device = self.device().type() == kDevice;
  const bool to_device = dst.device().type() == kDevice;
  if (from_device && to_device) {
    const bool plain = !self.is_conj() && !self.is_neg() && !dst.is_conj() &&
        !dst.is_neg();
    if (self.device() == dst.device() && plain) {
      if (dst.numel() > 0) {
        device_copy(dst, self);
      }
    } else {
      // Across devices, or with lazy conj/neg bits: through the host.
      copy_host_to_device(dst, copy_device_to_host(self));
    }
  } else if (to_device && self.is_cpu()) {
    copy_host_to_device(dst, self);
  } else if (from_device && dst.is_cpu()) {
    const bool direct = dst.is_contiguous() && dst.sizes() == self.sizes() &&
        dst.scalar_type() == self.scalar_type() && !self.is_conj() &&
        !self.is_neg() && !dst.is_conj() && !dst.is_neg();
    if (direct) {
      if (self.numel() > 0) {
        const rtpu_tensor_ref ref = tensor_ref(self);
        check(rtpu_tensor_copy_to_host(&ref, dst.mutable_data_ptr(), dst.nbytes()));
      }
    } else {
      dst.copy_(copy_device_to_host(self));
    }
  } else {
    TORCH_CHECK(
        false,
        "rtpu: cannot copy a tensor from ",
        self.device(),
        " to ",
        dst.device());
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return copy_device_to_host(self).resolve_conj().resolve_neg().item();
}

// ATen's set_storage_cpu_ with rtpu storages.
at::Tensor& set_storage(
    at::Tensor& self,
    c10::Storage source,
    c10::SymInt storage_offset,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  const int64_t offset = storage_offset.expect_int();
  const c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  const c10::IntArrayRef strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, std::move(source), offset, sizes, strides);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  const at::OptionalIntArrayRef stride_opt = strides.data() != nullptr
      ? at::OptionalIntArrayRef(strides)
      : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), sizes, stride_opt, true);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto numel =
      static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return self.set_(std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() != source.unsafeGetTensorImpl()) {
    return self.set_(
        source.storage(),
        source.storage_offset(),
        source.sizes(),
        source.strides());
  }
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(
      c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return self.set_(std::move(storage), 0, {0}, {});
}

// Module._apply (`model.to("tpu")`, `.tpu()`, `.cpu()`) swaps a parameter's
// data in place, keeping the Parameter object (and so tied weights and the
// optimizer's references), only when this says yes; otherwise it makes new
// Parameters. c10's TensorImpl::has_compatible_shallow_copy_type says yes
// for dense tensors of the backends it lists (CPU, CUDA, ...) and leaves
// PrivateUse1 to its backend. A tpu tensor is a plain dense TensorImpl, as a
// CPU one is, so c10's rule answers with its backend read as CPU. The rule
// is symmetric, so it is asked of whichever side is not a tpu tensor; two
// tpu tensors are both dense.
bool has_compatible_shallow_copy_type(
    const at::Tensor& self,
    const at::Tensor& from) {
  constexpr auto kTpuBit = c10::BackendComponent::PrivateUse1Bit;
  const bool self_tpu = self.key_set().has_backend(kTpuBit);
  const bool from_tpu = from.key_set().has_backend(kTpuBit);
  if (self_tpu && from_tpu) {
    return true;
  }
  const at::Tensor& other = self_tpu ? from : self;
  const c10::DispatchKeySet tpu_keys = (self_tpu ? self : from).key_set();
  return other.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
      tpu_keys.remove_backend(kTpuBit) |
      c10::DispatchKeySet(c10::BackendComponent::CPUBit));
}

} // namespace

// The ops this file implements, as X(overload name, kernel): listed once for
// both their registration and shim_op_names().
#define RTPU_SHIM_OPS(X)                                              \
  X("empty.memory_format", empty_memory_format)                       \
  X("empty_strided", empty_strided)                                   \
  X("as_strided", as_strided)                                         \
  X("view", view)                                                     \
  X("_reshape_alias", reshape_alias)                                  \
  X("unfold", unfold)                                                 \
  X("view_as_real", view_as_real)                                     \
  X("view_as_complex", view_as_complex)                               \
  X("resize_", resize_)                                               \
  X("_copy_from", copy_from)                                          \
  X("_copy_from_and_resize", copy_from_and_resize)                    \
  X("_local_scalar_dense", local_scalar_dense)                        \
  X("set_.source_Storage", set_source_storage)                        \
  X("set_.source_Storage_storage_offset", set_storage)                \
  X("set_.source_Tensor", set_source_tensor)                          \
  X("set_", set_empty)                                                \
  X("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type)

const std::unordered_set<std::string>& shim_op_names() {
#define RTPU_SCHEMA_NAME(name, kernel) "aten::" name,
  // copy_ is not registered by anyone: ATen's composite kernel routes every
  // direction through _copy_from, so the boxed kernel must not take it.
  static const std::unordered_set<std::string> names = {
      RTPU_SHIM_OPS(RTPU_SCHEMA_NAME) "aten::copy_"};
#undef RTPU_SCHEMA_NAME
  return names;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
#define RTPU_REGISTER(name, kernel) m.impl(name, TORCH_FN(kernel));
  RTPU_SHIM_OPS(RTPU_REGISTER)
#undef RTPU_REGISTER
}

// copy_ lets lazily conjugated or negated sources through to _copy_from,
// which applies the bits itself. Without these fallthroughs ATen's math-bit
// fallback would resolve the source with clone(), which copies through
// _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

} // namespace rtpu_torch
