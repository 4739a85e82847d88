#include "compiler/run_graph.h"

#include <utility>

#include "core/error.h"

namespace kiln::compiler {

Tensor constant_tensor(const Node& node) {
  const TensorType& type = node.outputs.at(0);
  Tensor t = scalar_tensor(node.attrs.scalar("value"), type.dtype, type.device);
  t.impl()->wrapped_number = type.wrapped_number;
  return t;
}

void check_inputs(const Graph& graph, const std::vector<Tensor>& inputs, const char* who) {
  KILN_CHECK(inputs.size() == graph.inputs().size(), "{}: the graph has {} inputs, got {} tensors", who,
             graph.inputs().size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value v = graph.inputs()[i];
    const Tensor& t = inputs[i];
    const TensorType& type = graph.type(v);
    KILN_CHECK(t.defined() && t.dtype() == type.dtype && t.shape() == type.shape && t.device() == type.device,
               "{}: input %{} \"{}\" expects {}, got {}", who, graph.value_number(v), graph.node(v).name,
               type.str(), t.defined() ? t.meta_str() : "an undefined tensor");
  }
}

std::vector<Tensor> finish_run(const Graph& graph, const std::vector<Tensor>& inputs,
                               const std::function<Tensor(Value)>& value) {
  std::vector<std::pair<Tensor, Tensor>> writes;
  for (const auto& [input, new_value] : graph.write_backs()) {
    Tensor v = value(new_value);
    if (v.same(value(input))) continue;  // computed in place (Program's memory plan)
    for (const Tensor& in : inputs)
      if (in.storage() == v.storage()) {
        v = v.clone();
        break;
      }
    writes.emplace_back(value(input), v);
  }
  for (auto& [target, v] : writes) target.copy_(v);

  std::vector<Tensor> outputs;
  outputs.reserve(graph.outputs().size());
  for (Value v : graph.outputs()) {
    Tensor out = value(v);
    for (const auto& [input, new_value] : graph.write_backs())
      if (new_value == v) {
        out = value(input);
        break;
      }
    outputs.push_back(out);
  }
  return outputs;
}

}  // namespace kiln::compiler
