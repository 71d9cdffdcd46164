// Kernels for the hot ops that take their arguments as PyTorch passes them.
//
// A boxed kernel gets its arguments as a stack of IValues, and putting a
// tensor on that stack copies it. Since PyTorch 2.10 a tensor's second C++
// reference increfs the Python object that holds it, taking the GIL the
// Python binding had dropped, and dropping the reference takes the GIL again
// to decref it: two GIL hand-offs per op, besides the stack itself. These
// kernels read the arguments where they are, for the calls the core takes as
// they are: tpu tensors on one device and real numbers. Every other call
// (CPU tensors, lazily conjugated views, complex numbers, symbolic sizes)
// and every call the core does not lower goes through the op's boxed kernel,
// which handles them for all ops.

#include "rtpu_torch.h"

#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_neg_ops.h>
#include <ATen/ops/_foreach_reciprocal_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_foreach_sub_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/where_ops.h>
#include <torch/library.h>

#include <string_view>
#include <tuple>
#include <unordered_map>

namespace rtpu_torch {
namespace {

// The op ABI arguments of one call of an op with N arguments, added in the
// op's order. `ok()` is false once an argument needs the boxed kernel.
template <size_t N>
class TypedArgs {
 public:
  bool ok() const {
    return ok_;
  }

  const rtpu_op_arg* data() const {
    return args_.data();
  }

  void add(const at::Tensor& t) {
    tensors_[next_] = &t;
    if (!t.defined()) {
      fail();
    } else if (t.device().type() == kDevice) {
      if (t.is_conj() || t.is_neg() || !on_device(t)) {
        fail();
        return;
      }
      next(RTPU_ARG_TENSOR).tensor = tensor_ref(t);
    } else if (
        t.is_cpu() && t.dim() == 0 &&
        t.unsafeGetTensorImpl()->is_wrapped_number()) {
      add(wrapped_number(t));
    } else {
      fail();
    }
  }

  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value() && t->defined()) {
      add(*t);
    } else {
      next(RTPU_ARG_NONE);
    }
  }

  void add(at::TensorList list) {
    auto& refs = lists_[next_];
    refs.reserve(list.size());
    for (const at::Tensor& t : list) {
      if (!t.defined() || t.device().type() != kDevice || t.is_conj() ||
          t.is_neg() || !on_device(t)) {
        fail();
        return;
      }
      refs.push_back(tensor_ref(t));
    }
    auto& a = next(RTPU_ARG_TENSOR_LIST);
    a.tensor_list = refs.data();
    a.list_size = refs.size();
  }

  void add(const c10::Scalar& s) {
    if (s.isSymbolic()) {
      fail();
    } else if (s.isBoolean()) {
      next(RTPU_ARG_BOOL).bool_value = s.toBool();
    } else if (s.isIntegral(/*includeBool=*/false)) {
      next(RTPU_ARG_INT).int_value = s.toLong();
    } else if (s.isFloatingPoint()) {
      next(RTPU_ARG_DOUBLE).double_value = s.toDouble();
    } else if (s.isComplex() && s.toComplexDouble().imag() == 0) {
      next(RTPU_ARG_DOUBLE).double_value = s.toComplexDouble().real();
    } else {
      fail();
    }
  }

  void add(int64_t value) {
    next(RTPU_ARG_INT).int_value = value;
  }

  void add(const c10::SymInt& value) {
    if (const auto concrete = value.maybe_as_int()) {
      add(*concrete);
    } else {
      fail();
    }
  }

  void add(double value) {
    next(RTPU_ARG_DOUBLE).double_value = value;
  }

  void add(bool value) {
    next(RTPU_ARG_BOOL).bool_value = value;
  }

  void add(std::optional<at::ScalarType> dtype) {
    if (dtype.has_value()) {
      next(RTPU_ARG_DTYPE).int_value = to_rtpu_dtype(*dtype);
    } else {
      next(RTPU_ARG_NONE);
    }
  }

  void add(std::optional<at::MemoryFormat> format) {
    if (format.has_value()) {
      next(RTPU_ARG_INT).int_value = static_cast<int64_t>(*format);
    } else {
      next(RTPU_ARG_NONE);
    }
  }

  void add(c10::IntArrayRef ints) {
    // The ArrayRef's elements outlive the call.
    auto& a = next(RTPU_ARG_INT_LIST);
    a.int_list = ints.data();
    a.list_size = ints.size();
  }

  void add(c10::SymIntArrayRef ints) {
    // Concrete sizes are stored as ints; symbolic ones take the boxed path.
    if (const auto concrete = c10::asIntArrayRefSlowOpt(ints)) {
      add(*concrete);
    } else {
      fail();
    }
  }

  void add(at::OptionalIntArrayRef ints) {
    if (ints.has_value()) {
      add(*ints);
    } else {
      next(RTPU_ARG_NONE);
    }
  }

  // An output mask, passed as a list of 0s and 1s, as the boxed kernel does.
  template <size_t M>
  void add(std::array<bool, M> mask) {
    auto& ints = int_lists_[next_];
    ints.assign(mask.begin(), mask.end());
    auto& a = next(RTPU_ARG_INT_LIST);
    a.int_list = ints.data();
    a.list_size = ints.size();
  }

  void add(std::string_view text) {
    // The op ABI takes a NUL-terminated string.
    auto& s = strings_[next_];
    s.assign(text);
    next(RTPU_ARG_STRING).string_value = s.c_str();
  }

  // Output `index` of `result`: a new tpu tensor, no tensor, or the tensor
  // argument it aliases.
  at::Tensor output(
      const c10::OperatorHandle& op,
      const rtpu_op_result* result,
      size_t index) const {
    return take_output(op.operator_name(), result, index, [&](size_t arg) {
      return arg < N ? tensors_[arg] : nullptr;
    });
  }

 private:
  rtpu_op_arg& next(uint32_t tag) {
    rtpu_op_arg& a = args_[next_++];
    a = rtpu_op_arg{};
    a.tag = tag;
    return a;
  }

  void fail() {
    ok_ = false;
    next(RTPU_ARG_NONE);
  }

  // Whether `t` is on the op's device: the first tpu tensor's.
  bool on_device(const at::Tensor& t) {
    if (!device_.has_value()) {
      device_ = t.device();
    }
    return t.device() == *device_;
  }

  std::array<rtpu_op_arg, N> args_{};
  std::array<const at::Tensor*, N> tensors_{};
  std::array<std::vector<rtpu_tensor_ref>, N> lists_;
  std::array<std::vector<int64_t>, N> int_lists_;
  std::array<std::string, N> strings_;
  std::optional<c10::Device> device_;
  size_t next_ = 0;
  bool ok_ = true;
};

template <class T>
struct IsTensorTuple : std::false_type {};
template <class... T>
struct IsTensorTuple<std::tuple<T...>>
    : std::bool_constant<(std::is_same_v<T, at::Tensor> && ...)> {};

// The op's results from the core's: as the boxed path returns them (an
// in-place op returns its first argument, as PyTorch's boxing does).
template <class Ret, size_t N, class First>
Ret typed_results(
    const c10::OperatorHandle& op,
    const TypedArgs<N>& typed,
    const rtpu_op_result* result,
    First& first) {
  const size_t count = rtpu_op_result_count(result);
  if constexpr (std::is_void_v<Ret>) {
    return;
  } else if constexpr (std::is_same_v<Ret, at::Tensor&>) {
    static_assert(std::is_same_v<First, at::Tensor>);
    return first;
  } else if constexpr (std::is_same_v<Ret, at::Tensor>) {
    TORCH_CHECK(
        count == 1,
        "rtpu: ",
        op.operator_name(),
        " gave ",
        count,
        " outputs; expected 1");
    return typed.output(op, result, 0);
  } else if constexpr (std::is_same_v<Ret, std::vector<at::Tensor>>) {
    std::vector<at::Tensor> outputs;
    outputs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      outputs.push_back(typed.output(op, result, i));
    }
    return outputs;
  } else {
    static_assert(IsTensorTuple<Ret>::value, "an unsupported return type");
    constexpr size_t size = std::tuple_size_v<Ret>;
    TORCH_CHECK(
        count == size,
        "rtpu: ",
        op.operator_name(),
        " gave ",
        count,
        " outputs; expected ",
        size);
    return [&]<size_t... I>(std::index_sequence<I...>) {
      return Ret(typed.output(op, result, I)...);
    }(std::make_index_sequence<size>());
  }
}

template <class Schema>
struct TypedKernel;

template <class Ret, class First, class... Rest>
struct TypedKernel<Ret(First, Rest...)> {
  static auto make(size_t core_op, const c10::OperatorHandle& op) {
    return [core_op, op, boxed = core_op_boxed_kernel(core_op)](
               First first, Rest... rest) -> Ret {
      constexpr size_t N = 1 + sizeof...(Rest);
      TypedArgs<N> typed;
      typed.add(first);
      (typed.add(rest), ...);
      if (typed.ok()) {
        std::string not_lowered;
        const ResultPtr result =
            call_core_op(core_op, typed.data(), N, &not_lowered);
        if (result != nullptr) {
          return typed_results<Ret>(op, typed, result.get(), first);
        }
      }
      return c10::impl::BoxedKernelWrapper<Ret(First, Rest...)>::call(
          boxed,
          op,
          kKeySet,
          std::forward<First>(first),
          std::forward<Rest>(rest)...);
    };
  }
};

using Registrar =
    void (*)(torch::Library&, const char*, size_t, const c10::OperatorHandle&);

template <class Op>
void register_op(
    torch::Library& m,
    const char* name,
    size_t core_op,
    const c10::OperatorHandle& op) {
  m.impl(
      name,
      torch::CppFunction(
          TypedKernel<typename Op::schema>::make(core_op, op)));
}

template <class Op>
std::pair<std::string, Registrar> entry() {
  std::string name = Op::name;
  if (*Op::overload_name != '\0') {
    name += std::string(".") + Op::overload_name;
  }
  return {name, &register_op<Op>};
}

// The ops of the training steps in benches/ (an MLP with SGD, a GPT with
// AdamW) and the elementwise ops around them: what a step records most.
const std::unordered_map<std::string, Registrar>& typed_ops() {
  static const auto* ops = new std::unordered_map<std::string, Registrar>{
      entry<at::_ops::add_Tensor>(),
      entry<at::_ops::add__Tensor>(),
      entry<at::_ops::sub_Tensor>(),
      entry<at::_ops::sub__Tensor>(),
      entry<at::_ops::mul_Tensor>(),
      entry<at::_ops::mul__Tensor>(),
      entry<at::_ops::mul_Scalar>(),
      entry<at::_ops::div_Tensor>(),
      entry<at::_ops::div__Tensor>(),
      entry<at::_ops::neg>(),
      entry<at::_ops::exp>(),
      entry<at::_ops::sqrt>(),
      entry<at::_ops::rsqrt>(),
      entry<at::_ops::tanh>(),
      entry<at::_ops::sigmoid>(),
      entry<at::_ops::relu>(),
      entry<at::_ops::threshold_backward>(),
      entry<at::_ops::gelu>(),
      entry<at::_ops::gelu_backward>(),
      entry<at::_ops::where_self>(),
      entry<at::_ops::addcmul_>(),
      entry<at::_ops::addcdiv_>(),
      entry<at::_ops::clone>(),
      entry<at::_ops::mm>(),
      entry<at::_ops::addmm>(),
      entry<at::_ops::bmm>(),
      entry<at::_ops::sum_dim_IntList>(),
      entry<at::_ops::_softmax>(),
      entry<at::_ops::_softmax_backward_data>(),
      entry<at::_ops::_log_softmax>(),
      entry<at::_ops::_log_softmax_backward_data>(),
      entry<at::_ops::nll_loss_forward>(),
      entry<at::_ops::nll_loss_backward>(),
      entry<at::_ops::native_layer_norm>(),
      entry<at::_ops::native_layer_norm_backward>(),
      entry<at::_ops::_foreach_add__List>(),
      entry<at::_ops::_foreach_add__Scalar>(),
      entry<at::_ops::_foreach_sub__Scalar>(),
      entry<at::_ops::_foreach_mul__Scalar>(),
      entry<at::_ops::_foreach_div__List>(),
      entry<at::_ops::_foreach_div__Scalar>(),
      entry<at::_ops::_foreach_lerp__Scalar>(),
      entry<at::_ops::_foreach_addcmul__Scalar>(),
      entry<at::_ops::_foreach_addcdiv__Scalar>(),
      entry<at::_ops::_foreach_sqrt>(),
      entry<at::_ops::_foreach_sqrt_>(),
      entry<at::_ops::_foreach_neg_>(),
      entry<at::_ops::_foreach_reciprocal_>(),
  };
  return *ops;
}

} // namespace

bool register_typed_kernel(
    torch::Library& m,
    const std::string& name,
    size_t core_op,
    const c10::OperatorHandle& op) {
  const auto found = typed_ops().find(name);
  if (found == typed_ops().end()) {
    return false;
  }
  const std::string unqualified = name.substr(name.find("::") + 2);
  found->second(m, unqualified.c_str(), core_op, op);
  return true;
}

} // namespace rtpu_torch
