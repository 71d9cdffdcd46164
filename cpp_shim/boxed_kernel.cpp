// One boxed kernel for every op the core implements (an instance per op,
// holding its core id): it turns the dispatcher's stack into rtpu_op_args,
// calls rtpu_op_call, and pushes the results back as tpu tensors (or as the
// out=/in-place arguments they alias). The hottest ops have typed kernels
// too (typed_kernels.cpp), which send the calls they do not take here.

#include "rtpu_torch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace rtpu_torch {
namespace {

// Core op ids by schema name, filled once while the library loads and
// read-only after.
struct OpTable {
  std::unordered_map<std::string, size_t> by_name;

  static OpTable& get() {
    static OpTable* table = new OpTable();
    return *table;
  }
};

// The device an op runs on: its first tpu tensor's, else the current one.
c10::Device op_device(c10::ArrayRef<c10::IValue> args) {
  for (const auto& value : args) {
    if (value.isTensor()) {
      const auto& t = value.toTensor();
      if (t.defined() && t.device().type() == kDevice) {
        return t.device();
      }
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) {
        if (t.defined() && t.device().type() == kDevice) {
          return t.device();
        }
      }
    } else if (value.isList()) {
      for (const c10::IValue& item : value.toListRef()) {
        if (item.isTensor() && item.toTensor().defined() &&
            item.toTensor().device().type() == kDevice) {
          return item.toTensor().device();
        }
      }
    }
  }
  return c10::Device(kDevice, current_device());
}

// The stack's arguments as rtpu_op_args. Owns everything the args point to.
class ArgConverter {
 public:
  ArgConverter(const c10::FunctionSchema& schema, c10::Device device)
      : schema_(schema), device_(device) {}

  std::vector<rtpu_op_arg> convert(c10::ArrayRef<c10::IValue> values) {
    std::vector<rtpu_op_arg> args;
    args.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      args.push_back(convert_one(schema_.arguments()[i], values[i]));
    }
    return args;
  }

 private:
  [[noreturn]] void unsupported(
      const c10::Argument& arg,
      const c10::IValue& value) const {
    TORCH_CHECK(
        false,
        "rtpu: ",
        schema_.operator_name(),
        ": argument '",
        arg.name(),
        "' of type ",
        arg.real_type()->str(),
        " holding ",
        value.tagKind(),
        " is not supported by rtpu's op ABI");
  }

  static rtpu_op_arg make(uint32_t tag) {
    rtpu_op_arg a{};
    a.tag = tag;
    return a;
  }

  static bool is_write(const c10::Argument& arg) {
    return arg.alias_info() != nullptr && arg.alias_info()->isWrite();
  }

  // A tensor as rtpu sees it: tpu tensors as they are (lazy conj/neg bits
  // resolved); the CPU tensors check_device lets in, copied to the op's
  // device. `nullopt` when the tensor is undefined.
  std::optional<rtpu_tensor_ref> device_tensor(
      const c10::Argument& arg,
      at::Tensor t) {
    if (!t.defined()) {
      return std::nullopt;
    }
    if (t.device().type() == kDevice) {
      check_device(arg, t);
      if (t.is_conj() || t.is_neg()) {
        TORCH_CHECK(
            !is_write(arg),
            "rtpu: ",
            schema_.operator_name(),
            " cannot write into '",
            arg.name(),
            "', a lazily conjugated or negated view");
        keep_alive_.push_back(t.resolve_conj().resolve_neg());
        return tensor_ref(keep_alive_.back());
      }
      // The stack keeps the tensor (and the metadata the ref points into)
      // alive for the call.
      return tensor_ref(t);
    }
    TORCH_CHECK(
        !(t.is_cpu() && is_write(arg)),
        "rtpu: ",
        schema_.operator_name(),
        " writes into '",
        arg.name(),
        "', which is on cpu; move it to tpu first");
    check_device(arg, t);
    keep_alive_.push_back(to_device(t, device_));
    return tensor_ref(keep_alive_.back());
  }

  // CUDA's rule, with CUDA's message: every tensor is on the op's device,
  // except CPU tensors of 0 dims (scalars, as TensorIterator takes them) and
  // the CPU index tensors of advanced indexing (`x[i]`, `x[i] = v`).
  void check_device(const c10::Argument& arg, const at::Tensor& t) const {
    if (t.device() == device_ ||
        (t.is_cpu() &&
         (t.dim() == 0 ||
          (arg.name() == "indices" && kCpuIndexOps.count(schema_.name()))))) {
      return;
    }
    c10::impl::common_device_check_failure(
        device_,
        t,
        c10::toString(schema_.operator_name()).c_str(),
        arg.name().c_str());
  }

  rtpu_op_arg scalar(const c10::Argument& arg, const c10::IValue& value) {
    if (value.isBool()) {
      auto a = make(RTPU_ARG_BOOL);
      a.bool_value = value.toBool();
      return a;
    }
    if (value.isInt() || value.isSymInt()) {
      auto a = make(RTPU_ARG_INT);
      a.int_value = value.isInt() ? value.toInt() : value.toSymInt().expect_int();
      return a;
    }
    if (value.isDouble() || value.isSymFloat()) {
      auto a = make(RTPU_ARG_DOUBLE);
      a.double_value = value.isDouble() ? value.toDouble()
                                        : value.toSymFloat().expect_float();
      return a;
    }
    if (value.isSymBool()) {
      auto a = make(RTPU_ARG_BOOL);
      a.bool_value = value.toSymBool().expect_true(__FILE__, __LINE__);
      return a;
    }
    if (value.isComplexDouble()) {
      // Its imaginary part is 0: run_core_op sends the others to the CPU.
      auto a = make(RTPU_ARG_DOUBLE);
      a.double_value = value.toComplexDouble().real();
      return a;
    }
    unsupported(arg, value);
  }

  rtpu_op_arg tensor(const c10::Argument& arg, const at::Tensor& t) {
    if (t.defined() && t.is_cpu() && t.dim() == 0 &&
        t.unsafeGetTensorImpl()->is_wrapped_number()) {
      // A Python number that ATen wrapped as a tensor: pass it as one.
      return scalar(arg, c10::IValue(wrapped_number(t)));
    }
    auto ref = device_tensor(arg, t);
    if (!ref) {
      return make(RTPU_ARG_NONE);
    }
    auto a = make(RTPU_ARG_TENSOR);
    a.tensor = *ref;
    return a;
  }

  rtpu_op_arg tensor_list(const c10::Argument& arg, const c10::IValue& value) {
    auto& refs = tensor_lists_.emplace_back();
    for (const c10::IValue& item : value.toListRef()) {
      std::optional<rtpu_tensor_ref> ref;
      if (item.isTensor()) {
        ref = device_tensor(arg, item.toTensor());
      } else if (!item.isNone()) {
        unsupported(arg, value);
      }
      // An absent element has a NULL storage.
      refs.push_back(ref.value_or(rtpu_tensor_ref{}));
    }
    auto a = make(RTPU_ARG_TENSOR_LIST);
    a.tensor_list = refs.data();
    a.list_size = refs.size();
    return a;
  }

  rtpu_op_arg int_list(const c10::Argument& arg, const c10::IValue& value) {
    auto& ints = int_lists_.emplace_back();
    for (const c10::IValue& item : value.toListRef()) {
      if (item.isInt()) {
        ints.push_back(item.toInt());
      } else if (item.isSymInt()) {
        ints.push_back(item.toSymInt().expect_int());
      } else if (item.isBool()) {
        ints.push_back(item.toBool() ? 1 : 0);
      } else {
        unsupported(arg, value);
      }
    }
    auto a = make(RTPU_ARG_INT_LIST);
    a.int_list = ints.data();
    a.list_size = ints.size();
    return a;
  }

  rtpu_op_arg double_list(const c10::Argument& arg, const c10::IValue& value) {
    auto& doubles = double_lists_.emplace_back();
    for (const c10::IValue& item : value.toListRef()) {
      if (item.isDouble()) {
        doubles.push_back(item.toDouble());
      } else if (item.isInt()) {
        doubles.push_back(static_cast<double>(item.toInt()));
      } else if (item.isBool()) {
        doubles.push_back(item.toBool() ? 1.0 : 0.0);
      } else if (item.isComplexDouble()) {
        doubles.push_back(item.toComplexDouble().real()); // imaginary part 0
      } else {
        unsupported(arg, value);
      }
    }
    auto a = make(RTPU_ARG_DOUBLE_LIST);
    a.double_list = doubles.data();
    a.list_size = doubles.size();
    return a;
  }

  rtpu_op_arg generator(const c10::IValue& value) {
    std::optional<at::Generator> given;
    if (value.isGenerator()) {
      given = value.toGenerator();
    }
    auto& state = int_lists_.emplace_back();
    const auto pair = next_random_state(given, device_.index());
    state.assign(pair.begin(), pair.end());
    auto a = make(RTPU_ARG_GENERATOR);
    a.int_list = state.data();
    a.list_size = state.size();
    return a;
  }

  rtpu_op_arg convert_one(const c10::Argument& arg, const c10::IValue& value) {
    c10::TypePtr type = arg.real_type();
    if (type->kind() == c10::TypeKind::OptionalType) {
      type = type->castRaw<c10::OptionalType>()->getElementType();
    }
    // A generator is always passed: the device's default one when absent.
    if (type->kind() == c10::TypeKind::GeneratorType) {
      return generator(value);
    }
    if (value.isNone()) {
      return make(RTPU_ARG_NONE);
    }
    switch (type->kind()) {
      case c10::TypeKind::TensorType:
        return tensor(arg, value.toTensor());
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType:
      case c10::TypeKind::FloatType:
      case c10::TypeKind::SymFloatType:
      case c10::TypeKind::BoolType:
      case c10::TypeKind::SymBoolType:
      case c10::TypeKind::NumberType:
        return scalar(arg, value);
      case c10::TypeKind::LayoutType:
      case c10::TypeKind::MemoryFormatType: {
        auto a = make(RTPU_ARG_INT);
        a.int_value = value.toInt();
        return a;
      }
      case c10::TypeKind::ScalarTypeType: {
        auto a = make(RTPU_ARG_DTYPE);
        a.int_value = to_rtpu_dtype(value.toScalarType());
        return a;
      }
      case c10::TypeKind::StringType: {
        auto& s = strings_.emplace_back(value.toStringRef());
        auto a = make(RTPU_ARG_STRING);
        a.string_value = s.c_str();
        return a;
      }
      case c10::TypeKind::DeviceObjType: {
        const c10::Device d = value.toDevice();
        TORCH_CHECK(
            d.type() == kDevice,
            "rtpu: ",
            schema_.operator_name(),
            ": argument '",
            arg.name(),
            "' is device ",
            d,
            "; expected a tpu device");
        auto a = make(RTPU_ARG_DEVICE);
        a.int_value = d.has_index() ? d.index() : device_.index();
        return a;
      }
      case c10::TypeKind::ListType: {
        c10::TypePtr element =
            type->castRaw<c10::ListType>()->getElementType();
        if (element->kind() == c10::TypeKind::OptionalType) {
          element = element->castRaw<c10::OptionalType>()->getElementType();
        }
        switch (element->kind()) {
          case c10::TypeKind::TensorType:
            return tensor_list(arg, value);
          case c10::TypeKind::IntType:
          case c10::TypeKind::SymIntType:
          case c10::TypeKind::BoolType:
            return int_list(arg, value);
          case c10::TypeKind::FloatType:
          case c10::TypeKind::NumberType:
            return double_list(arg, value);
          default:
            unsupported(arg, value);
        }
      }
      default:
        unsupported(arg, value);
    }
  }

  // The ops whose `indices` may be CPU tensors, as on CUDA.
  inline static const std::unordered_set<std::string> kCpuIndexOps = {
      "aten::index", "aten::index_put", "aten::index_put_",
      "aten::_index_put_impl_"};

  const c10::FunctionSchema& schema_;
  const c10::Device device_;
  // Lists: elements never move, so pointers into them stay valid, and an
  // empty list allocates nothing (most calls fill none of them).
  std::list<at::Tensor> keep_alive_;
  std::list<std::vector<rtpu_tensor_ref>> tensor_lists_;
  std::list<std::vector<int64_t>> int_lists_;
  std::list<std::vector<double>> double_lists_;
  std::list<std::string> strings_;
};

// The argument a mutable return writes (same alias set), for out= ops.
std::optional<size_t> written_argument(
    const c10::FunctionSchema& schema,
    const c10::Argument& ret) {
  if (ret.alias_info() == nullptr || !ret.alias_info()->isWrite()) {
    return std::nullopt;
  }
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* info = arguments[i].alias_info();
    if (info != nullptr && info->isWrite() &&
        info->beforeSets() == ret.alias_info()->beforeSets()) {
      return i;
    }
  }
  return std::nullopt;
}

bool is_tensor_list(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::ListType &&
      type->castRaw<c10::ListType>()->getElementType()->kind() ==
      c10::TypeKind::TensorType;
}

// Whether `value` holds a complex number with a nonzero imaginary part,
// which the op ABI cannot pass: such calls run on the CPU.
bool holds_imaginary_number(const c10::IValue& value) {
  if (value.isComplexDouble()) {
    return value.toComplexDouble().imag() != 0;
  }
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return t.defined() && t.is_complex() && t.is_cpu() && t.dim() == 0 &&
        t.unsafeGetTensorImpl()->is_wrapped_number() &&
        wrapped_number(t).toComplexDouble().imag() != 0;
  }
  if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      if (holds_imaginary_number(item)) {
        return true;
      }
    }
  }
  return false;
}

// Runs core op `core_op` on the dispatcher's stack. The arguments stay on
// the stack, unread by anything else, until the results replace them.
void run_core_op(
    size_t core_op,
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, num_args);
  for (size_t i = 0; i < num_args; ++i) {
    if (holds_imaginary_number(args[i])) {
      cpu_fallback(
          op,
          stack,
          c10::toString(schema.operator_name()) + ": argument '" +
              schema.arguments()[i].name() +
              "' has an imaginary part, which rtpu's op ABI cannot pass");
      return;
    }
  }
  ArgConverter converter(schema, op_device(args));
  std::string not_lowered;
  const auto converted = converter.convert(args);
  const ResultPtr result =
      call_core_op(core_op, converted.data(), converted.size(), &not_lowered);
  if (result == nullptr) {
    cpu_fallback(op, stack, not_lowered);
    return;
  }

  const size_t count = rtpu_op_result_count(result.get());
  std::vector<at::Tensor> outputs;
  outputs.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    outputs.push_back(take_output(
        schema.operator_name(), result.get(), i, [&](size_t arg) {
          return arg < args.size() && args[arg].isTensor()
              ? &args[arg].toTensor()
              : nullptr;
        }));
  }

  const auto& returns = schema.returns();
  const bool one_list =
      returns.size() == 1 && is_tensor_list(returns[0].type());
  TORCH_CHECK(
      returns.empty() || one_list || outputs.size() == returns.size(),
      "rtpu: ",
      schema.operator_name(),
      " returns ",
      returns.size(),
      " values but the core gave ",
      outputs.size());
  for (size_t i = 0; i < returns.size() && !one_list; ++i) {
    const auto target = written_argument(schema, returns[i]);
    at::Tensor& value = outputs[i];
    if (!target) {
      continue;
    }
    // out=: the core computed a new tensor; write it into `out`.
    const at::Tensor& out = args[*target].toTensor();
    if (value.defined() && !value.is_same(out)) {
      TORCH_CHECK(
          c10::canCast(value.scalar_type(), out.scalar_type()),
          "rtpu: ",
          schema.operator_name(),
          ": result type ",
          value.scalar_type(),
          " can't be cast to the desired output type ",
          out.scalar_type());
      at::native::resize_output(out, value.sizes());
      out.copy_(value);
      value = out;
    }
  }

  torch::jit::drop(*stack, num_args);
  if (returns.empty()) {
    return;
  }
  if (one_list) {
    torch::jit::push(*stack, c10::List<at::Tensor>(outputs));
    return;
  }
  for (at::Tensor& value : outputs) {
    torch::jit::push(*stack, std::move(value));
  }
}

// The kernel registered for one core op: it holds the op's core id, so a
// call does not look it up by name.
class CoreOpKernel final : public c10::OperatorKernel {
 public:
  explicit CoreOpKernel(size_t core_op) : core_op_(core_op) {}

  void operator()(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet /*keys*/,
      torch::jit::Stack* stack) const {
    run_core_op(core_op_, op, stack);
  }

 private:
  const size_t core_op_;
};

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  auto& table = OpTable::get();
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<std::string> unknown;
  std::vector<std::string> composite;
  const size_t count = rtpu_op_count();
  const std::string prefix = "aten::";
  for (size_t i = 0; i < count; ++i) {
    const std::string name = rtpu_op_name(i);
    table.by_name.emplace(name, i);
    if (shim_op_names().count(name) != 0) {
      continue;
    }
    if (name.rfind(prefix, 0) != 0) {
      unknown.push_back(name);
      continue;
    }
    const auto dot = name.find('.');
    const c10::OperatorName op_name(
        name.substr(0, dot),
        dot == std::string::npos ? "" : name.substr(dot + 1));
    const auto handle = dispatcher.findSchema(op_name);
    if (!handle.has_value()) {
      unknown.push_back(name);
      continue;
    }
    // Such ops decompose before reaching a backend; without an autograd
    // formula of their own, a kernel here would cut them off from autograd.
    if (handle->hasKernelForDispatchKey(
            c10::DispatchKey::CompositeImplicitAutograd) &&
        !handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd)) {
      composite.push_back(name);
      continue;
    }
    if (!register_typed_kernel(m, name, i, *handle)) {
      m.impl(
          name.substr(prefix.size()).c_str(),
          torch::CppFunction::makeFromBoxedKernel(core_op_boxed_kernel(i)));
    }
  }
  if (!unknown.empty()) {
    TORCH_WARN(
        "rtpu: the core implements ops this PyTorch does not define; they "
        "are not registered: ",
        c10::Join(", ", unknown));
  }
  if (!composite.empty()) {
    TORCH_WARN(
        "rtpu: not registering CompositeImplicitAutograd ops without an "
        "autograd formula (they decompose): ",
        c10::Join(", ", composite));
  }
}

} // namespace

c10::Scalar wrapped_number(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble:
      return *t.const_data_ptr<double>();
    case at::kLong:
      return *t.const_data_ptr<int64_t>();
    case at::kBool:
      return *t.const_data_ptr<bool>();
    case at::kComplexDouble:
      return *t.const_data_ptr<c10::complex<double>>();
    default:
      return t.item();
  }
}

ResultPtr call_core_op(
    size_t op,
    const rtpu_op_arg* args,
    size_t count,
    std::string* not_lowered) {
  // A recorded op keeps its Python line, for errors raised when its graph
  // runs later; eager errors surface at the call itself.
  if (rtpu_engine_mode() == RTPU_MODE_DEFERRED) {
    rtpu_location_set_current(python_location());
  }
  rtpu_op_result* raw = nullptr;
  rtpu_error* error = rtpu_op_call(runtime(), op, args, count, &raw);
  if (error != nullptr &&
      rtpu_error_code(error) == RTPU_ERROR_CODE_UNIMPLEMENTED) {
    *not_lowered = rtpu_error_message(error);
    rtpu_error_destroy(error);
    return nullptr;
  }
  check(error);
  return ResultPtr(raw);
}

c10::BoxedKernel core_op_boxed_kernel(size_t core_op) {
  return c10::BoxedKernel::makeFromFunctor(
      std::make_unique<CoreOpKernel>(core_op));
}

at::Tensor new_tensor(const rtpu_op_output& out) {
  // Owned from here on, whatever fails next.
  c10::Storage storage = wrap_storage(out.storage);
  const auto dtype = from_rtpu_dtype(out.dtype);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), kKeySet, c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(
      c10::IntArrayRef(out.sizes, out.ndim),
      c10::IntArrayRef(out.strides, out.ndim),
      out.storage_offset);
  return tensor;
}

size_t op_id(const char* schema_name) {
  const auto& by_name = OpTable::get().by_name;
  const auto found = by_name.find(schema_name);
  TORCH_CHECK(
      found != by_name.end(),
      "rtpu: the core does not implement ",
      schema_name);
  return found->second;
}

void device_copy(const at::Tensor& dst, const at::Tensor& src) {
  static const size_t copy_op = op_id("aten::copy_");
  std::vector<rtpu_op_arg> args(3);
  args[0].tag = RTPU_ARG_TENSOR;
  args[0].tensor = tensor_ref(dst);
  args[1].tag = RTPU_ARG_TENSOR;
  args[1].tensor = tensor_ref(src);
  args[2].tag = RTPU_ARG_BOOL;
  args[2].bool_value = false;
  std::string not_lowered;
  TORCH_CHECK_NOT_IMPLEMENTED(
      call_core_op(copy_op, args.data(), args.size(), &not_lowered) != nullptr,
      "rtpu: ",
      not_lowered);
}

} // namespace rtpu_torch
