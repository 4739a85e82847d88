// The reference runner (compiler/trace.h): each node of a graph run through the eager ops.
#include <cstddef>
#include <unordered_map>

#include "compiler/trace.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::compiler {

namespace {

// A 0-d tensor holding a constant node's value, typed exactly as the node says.
Tensor constant_tensor(const Node& node) {
  const TensorType& type = node.outputs.at(0);
  Tensor t = scalar_tensor(node.attrs.scalar("value"), type.dtype, type.device);
  t.impl()->wrapped_number = type.wrapped_number;
  return t;
}

void check_input(const Graph& graph, Value v, const Tensor& t) {
  const Node& node = graph.node(v);
  const TensorType& type = graph.type(v);
  // Layout is a strides class the compiled code will guard on; the eager ops take any.
  KILN_CHECK(t.defined() && t.dtype() == type.dtype && t.shape() == type.shape &&
                 t.device() == type.device,
             "interpret: input %{} \"{}\" expects {}, got {}", graph.value_number(v), node.name,
             type.str(), t.defined() ? t.meta_str() : "an undefined tensor");
}

}  // namespace

std::vector<Tensor> interpret(const Graph& graph, const std::vector<Tensor>& inputs) {
  KILN_CHECK(inputs.size() == graph.inputs().size(),
             "interpret: the graph has {} inputs, got {} tensors", graph.inputs().size(),
             inputs.size());
  std::unordered_map<int32_t, size_t> input_position;  // input node -> index into `inputs`
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    check_input(graph, graph.inputs()[i], inputs[i]);
    input_position[graph.inputs()[i].node] = i;
  }

  NoGradGuard no_grad;
  const std::vector<Node>& nodes = graph.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
  auto value = [&](Value v) -> Tensor {
    if (!v.defined()) return {};
    return values.at(static_cast<size_t>(v.node)).at(static_cast<size_t>(v.output));
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    switch (node.kind) {
      case NodeKind::input: {
        auto it = input_position.find(static_cast<int32_t>(i));
        KILN_CHECK(it != input_position.end(),
                   "interpret: node {} is an input missing from the graph's inputs", i);
        values[i] = {inputs[it->second]};
        break;
      }
      case NodeKind::constant:
        values[i] = {constant_tensor(node)};
        break;
      case NodeKind::op: {
        std::vector<Tensor> args;
        args.reserve(node.inputs.size());
        for (Value v : node.inputs) args.push_back(value(v));
        const OpDef& def = node.def ? *node.def : find_op(node.op);
        values[i] = call_op(def, std::move(args), node.attrs);
        KILN_CHECK(values[i].size() == node.outputs.size(),
                   "interpret: {} made {} outputs, the graph says {}", node.op, values[i].size(),
                   node.outputs.size());
        break;
      }
    }
  }

  // Every write-back reads the values as they were before any of them is written: a value
  // over an input's memory (a view of it) is copied out first.
  std::vector<std::pair<Tensor, Tensor>> writes;
  for (const auto& [input, new_value] : graph.write_backs()) {
    Tensor v = value(new_value);
    for (const Tensor& in : inputs)
      if (in.storage() == v.storage()) {
        v = v.clone();
        break;
      }
    writes.emplace_back(value(input), v);
  }
  for (auto& [target, v] : writes) target.copy_(v);

  // A value written back is returned as its input tensor, as the eager in-place op did.
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

std::vector<Tensor> Trace::replay(const std::vector<Tensor>& args) const {
  KILN_CHECK(!broken(), "Trace::replay: the trace stopped at a graph break ({}) and has no graph",
             break_reason);
  const std::vector<Tensor> inputs = inputs_for(args);
  std::vector<Tensor> outputs = runner ? runner(inputs) : interpret(graph, inputs);
  size_t next = static_cast<size_t>(num_results);
  for (const GradEffect& effect : grad_effects) {
    const Tensor& leaf = inputs.at(static_cast<size_t>(effect.input));
    leaf.set_grad(effect.value.defined() ? outputs.at(next++) : Tensor());
  }
  outputs.resize(static_cast<size_t>(num_results));
  return outputs;
}

}  // namespace kiln::compiler
