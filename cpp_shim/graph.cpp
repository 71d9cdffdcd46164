// Captured graphs for the torch.compile backend: torch.ops.rtpu.capture_begin
// / capture_end record a graph once; torch.classes.rtpu.Graph replays it on
// new inputs with one call into the core (no per-op dispatch).

#include "rtpu_torch.h"

#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

namespace rtpu_torch {
namespace {

std::vector<rtpu_tensor_ref> tensor_refs(const std::vector<at::Tensor>& tensors) {
  std::vector<rtpu_tensor_ref> refs;
  refs.reserve(tensors.size());
  for (const auto& t : tensors) {
    refs.push_back(tensor_ref(t));
  }
  return refs;
}

struct Graph : torch::CustomClassHolder {
  explicit Graph(rtpu_graph* raw) : raw(raw) {}
  ~Graph() override {
    rtpu_graph_destroy(raw);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool replayable() const {
    return rtpu_graph_replayable(raw);
  }

  std::string reason() const {
    const char* reason = rtpu_graph_reason(raw);
    return reason == nullptr ? "" : reason;
  }

  std::vector<at::Tensor> replay(std::vector<at::Tensor> inputs) const {
    const auto refs = tensor_refs(inputs);
    rtpu_op_result* raw_result = nullptr;
    check(rtpu_graph_replay(raw, refs.data(), refs.size(), &raw_result));
    const std::unique_ptr<rtpu_op_result, void (*)(rtpu_op_result*)> result(
        raw_result, rtpu_op_result_destroy);
    const size_t count = rtpu_op_result_count(result.get());
    std::vector<at::Tensor> outputs;
    outputs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      rtpu_op_output out{};
      out.struct_size = RTPU_OP_OUTPUT_STRUCT_SIZE;
      check(rtpu_op_result_get(result.get(), i, &out));
      outputs.push_back(new_tensor(out));
    }
    return outputs;
  }

  rtpu_graph* raw;
};

void op_capture_begin(const std::vector<at::Tensor>& inputs) {
  const auto refs = tensor_refs(inputs);
  check(rtpu_capture_begin(runtime(), refs.data(), refs.size()));
}

c10::intrusive_ptr<Graph> op_capture_end(
    const std::vector<at::Tensor>& outputs,
    const std::string& site) {
  const auto refs = tensor_refs(outputs);
  rtpu_graph* raw = nullptr;
  check(rtpu_capture_end(runtime(), refs.data(), refs.size(), site.c_str(), &raw));
  return c10::make_intrusive<Graph>(raw);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(rtpu, m) {
  m.class_<Graph>("Graph")
      .def("replayable", &Graph::replayable)
      .def("reason", &Graph::reason)
      .def("replay", &Graph::replay);
  // Records every op until capture_end into one graph of these inputs.
  m.def("capture_begin(Tensor[] inputs) -> ()", TORCH_FN(op_capture_begin));
  // Runs the recorded graph (outputs get their values) and returns it.
  m.def(
      "capture_end(Tensor[] outputs, str site) -> __torch__.torch.classes.rtpu.Graph",
      TORCH_FN(op_capture_end));
}

} // namespace rtpu_torch
