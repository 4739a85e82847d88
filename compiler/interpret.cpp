// The reference runner (compiler/trace.h): each node of a graph run through the eager ops.
#include <cstddef>
#include <unordered_map>

#include "compiler/run_graph.h"
#include "compiler/trace.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::compiler {

std::vector<Tensor> interpret(const Graph& graph, const std::vector<Tensor>& inputs) {
  check_inputs(graph, inputs, "interpret");
  std::unordered_map<int32_t, size_t> input_position;  // input node -> index into `inputs`
  for (size_t i = 0; i < graph.inputs().size(); ++i) input_position[graph.inputs()[i].node] = i;

  const RandomBase base = random_base(graph, inputs);
  Attrs random_attrs;

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
        values[i] = call_op(def, std::move(args), call_attrs(node, base, random_attrs, "interpret"));
        KILN_CHECK(values[i].size() == node.outputs.size(),
                   "interpret: {} made {} outputs, the graph says {}", node.op, values[i].size(),
                   node.outputs.size());
        break;
      }
    }
  }

  return finish_run(graph, inputs, value);
}

}  // namespace kiln::compiler
