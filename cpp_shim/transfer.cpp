// Host <-> device copies of tensors through rtpu's strided views.

#include "rtpu_torch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace rtpu_torch {

rtpu_tensor_ref tensor_ref(const at::Tensor& tensor) {
  TORCH_CHECK(
      tensor.device().type() == kDevice,
      "rtpu: expected a tpu tensor, got one on ",
      tensor.device());
  rtpu_tensor_ref ref{};
  ref.storage = storage_handle(tensor.storage());
  ref.storage_offset = tensor.storage_offset();
  ref.sizes = tensor.sizes().data();
  ref.strides = tensor.strides().data();
  ref.ndim = static_cast<size_t>(tensor.dim());
  ref.dtype = to_rtpu_dtype(tensor.scalar_type());
  return ref;
}

void copy_host_to_device(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_INTERNAL_ASSERT(src.is_cpu());
  if (dst.numel() == 0) {
    return;
  }
  // The storage must hold what makes dst's logical values equal src's.
  at::Tensor host = src;
  if (dst.is_neg()) {
    host = host.neg();
  }
  if (dst.is_conj()) {
    host = host.conj();
  }
  host = host.resolve_conj()
             .resolve_neg()
             .to(dst.scalar_type())
             .expand(dst.sizes())
             .contiguous();
  const rtpu_tensor_ref ref = tensor_ref(dst);
  check(rtpu_tensor_copy_from_host(&ref, host.const_data_ptr(), host.nbytes()));
}

at::Tensor copy_device_to_host(const at::Tensor& src) {
  at::Tensor host = at::detail::empty_cpu(src.sizes(), src.scalar_type());
  if (src.numel() > 0) {
    const rtpu_tensor_ref ref = tensor_ref(src);
    check(rtpu_tensor_copy_to_host(&ref, host.mutable_data_ptr(), host.nbytes()));
  }
  // The storage holds src's physical values; its bits say how to read them.
  if (src.is_conj()) {
    host = host.conj();
  }
  if (src.is_neg()) {
    host = at::_neg_view(host);
  }
  return host;
}

at::Tensor to_device(const at::Tensor& src, c10::Device device) {
  const at::Tensor out = at::empty(
      src.sizes(), src.options().device(device).memory_format(at::MemoryFormat::Contiguous));
  copy_host_to_device(out, src);
  return out;
}

} // namespace rtpu_torch
