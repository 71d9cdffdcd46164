// torch dtypes <-> RTPU_DTYPE_* codes.

#include "rtpu_torch.h"

#include <c10/util/Exception.h>

namespace rtpu_torch {

uint32_t to_rtpu_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Bool:
      return RTPU_DTYPE_BOOL;
    case c10::ScalarType::Char:
      return RTPU_DTYPE_INT8;
    case c10::ScalarType::Short:
      return RTPU_DTYPE_INT16;
    case c10::ScalarType::Int:
      return RTPU_DTYPE_INT32;
    case c10::ScalarType::Long:
      return RTPU_DTYPE_INT64;
    case c10::ScalarType::Byte:
      return RTPU_DTYPE_UINT8;
    case c10::ScalarType::UInt16:
      return RTPU_DTYPE_UINT16;
    case c10::ScalarType::UInt32:
      return RTPU_DTYPE_UINT32;
    case c10::ScalarType::UInt64:
      return RTPU_DTYPE_UINT64;
    case c10::ScalarType::Half:
      return RTPU_DTYPE_FLOAT16;
    case c10::ScalarType::BFloat16:
      return RTPU_DTYPE_BFLOAT16;
    case c10::ScalarType::Float:
      return RTPU_DTYPE_FLOAT32;
    case c10::ScalarType::Double:
      return RTPU_DTYPE_FLOAT64;
    case c10::ScalarType::ComplexFloat:
      return RTPU_DTYPE_COMPLEX64;
    case c10::ScalarType::ComplexDouble:
      return RTPU_DTYPE_COMPLEX128;
    default:
      TORCH_CHECK(false, "rtpu: dtype ", type, " is not supported on tpu");
  }
}

c10::ScalarType from_rtpu_dtype(uint32_t code) {
  switch (code) {
    case RTPU_DTYPE_BOOL:
      return c10::ScalarType::Bool;
    case RTPU_DTYPE_INT8:
      return c10::ScalarType::Char;
    case RTPU_DTYPE_INT16:
      return c10::ScalarType::Short;
    case RTPU_DTYPE_INT32:
      return c10::ScalarType::Int;
    case RTPU_DTYPE_INT64:
      return c10::ScalarType::Long;
    case RTPU_DTYPE_UINT8:
      return c10::ScalarType::Byte;
    case RTPU_DTYPE_UINT16:
      return c10::ScalarType::UInt16;
    case RTPU_DTYPE_UINT32:
      return c10::ScalarType::UInt32;
    case RTPU_DTYPE_UINT64:
      return c10::ScalarType::UInt64;
    case RTPU_DTYPE_FLOAT16:
      return c10::ScalarType::Half;
    case RTPU_DTYPE_BFLOAT16:
      return c10::ScalarType::BFloat16;
    case RTPU_DTYPE_FLOAT32:
      return c10::ScalarType::Float;
    case RTPU_DTYPE_FLOAT64:
      return c10::ScalarType::Double;
    case RTPU_DTYPE_COMPLEX64:
      return c10::ScalarType::ComplexFloat;
    case RTPU_DTYPE_COMPLEX128:
      return c10::ScalarType::ComplexDouble;
    default:
      TORCH_CHECK(false, "rtpu: unknown RTPU_DTYPE code ", code);
  }
}

} // namespace rtpu_torch
