// verify(): the invariants of a graph that every pass must keep (compiler/ir/graph.h).
#include <fmt/format.h>

#include <set>

#include "compiler/ir/graph.h"
#include "core/error.h"

namespace kiln::compiler {

namespace {

// Checks one node, numbered `first_value` (its %N), against the nodes before it.
class NodeChecker {
 public:
  NodeChecker(const Graph& graph, size_t index, int64_t first_value)
      : graph_(graph), index_(index), node_(graph.nodes()[index]), first_value_(first_value) {}

  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("verify: node {} (%{} = {}): {}", index_, first_value_, node_.op,
         fmt::format(format, std::forward<Args>(args)...));
  }

  void check() {
    switch (node_.kind) {
      case NodeKind::input: check_input(); break;
      case NodeKind::constant: check_constant(); break;
      case NodeKind::op: check_op(); break;
    }
  }

 private:
  void check_input() {
    if (node_.outputs.size() != 1 || !node_.outputs[0].defined) error("an input must have one defined type");
    if (node_.name.empty()) error("an input needs a name");
  }

  void check_constant() {
    if (node_.outputs.size() != 1 || !node_.outputs[0].defined || !node_.outputs[0].shape.empty())
      error("a constant must be one 0-d tensor");
    if (node_.attrs.items().size() != 1 || node_.attrs.items()[0].name != "value" ||
        !std::holds_alternative<Scalar>(node_.attrs.items()[0].value))
      error("a constant needs exactly the attribute value=$N, has {}", attrs_text(node_.attrs));
  }

  void check_op() {
    if (node_.def == nullptr) error("an op node without its registry op");
    if (node_.def->name != node_.op) error("the node names op {} but points at {}", node_.op, node_.def->name);
    std::vector<TensorMeta> metas;
    for (size_t i = 0; i < node_.inputs.size(); ++i) {
      const Value v = node_.inputs[i];
      if (!v.defined()) {
        metas.push_back(TensorMeta{.shape = {}, .defined = false});
        continue;
      }
      if (static_cast<size_t>(v.node) >= index_)
        error("input {} is node {}, which is not defined before this node", i, v.node);
      const Node& producer = graph_.nodes()[static_cast<size_t>(v.node)];
      if (v.output < 0 || static_cast<size_t>(v.output) >= producer.outputs.size())
        error("input {} is output {} of node {}, which has {} outputs", i, v.output, v.node, producer.outputs.size());
      metas.push_back(producer.outputs[static_cast<size_t>(v.output)].meta());
    }
    std::vector<TensorMeta> expected;
    try {
      expected = node_.def->infer(metas, node_.attrs);
    } catch (const Error& e) {
      error("the shape rule rejects the inputs: {}", e.what());
    }
    if (expected.size() != node_.outputs.size())
      error("has {} outputs, its shape rule gives {}", node_.outputs.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const TensorType want = TensorType::of(expected[i]);
      if (!(want == node_.outputs[i]))
        error("output {} is {}, its shape rule says {}", i, node_.outputs[i].str(), want.str());
    }
  }

  const Graph& graph_;
  size_t index_;
  const Node& node_;
  int64_t first_value_;
};

// A value that refers to an existing node output.
bool exists(const Graph& graph, Value v) {
  return v.defined() && static_cast<size_t>(v.node) < graph.nodes().size() && v.output >= 0 &&
         static_cast<size_t>(v.output) < graph.nodes()[static_cast<size_t>(v.node)].outputs.size();
}

}  // namespace

void verify(const Graph& graph) {
  int64_t first_value = 0;
  for (size_t index = 0; index < graph.nodes().size(); ++index) {
    NodeChecker(graph, index, first_value).check();
    first_value += static_cast<int64_t>(graph.nodes()[index].outputs.size());
  }
  KILN_CHECK(first_value == graph.num_values(), "verify: the nodes define {} values, the graph counts {}",
             first_value, graph.num_values());

  std::set<std::string> names;
  size_t input_nodes = 0;
  for (const Node& node : graph.nodes()) input_nodes += node.kind == NodeKind::input;
  KILN_CHECK(input_nodes == graph.inputs().size(), "verify: {} input nodes but {} graph inputs", input_nodes,
             graph.inputs().size());
  for (Value v : graph.inputs()) {
    KILN_CHECK(exists(graph, v) && graph.node(v).kind == NodeKind::input,
               "verify: graph input (node {}) is not an input node", v.node);
    KILN_CHECK(names.insert(graph.node(v).name).second, "verify: two inputs named \"{}\"", graph.node(v).name);
  }
  // The random base: one input at most, of the type the runners read; a random node that
  // draws from it (no seed of its own) needs it.
  const Node* random_input = nullptr;
  for (Value v : graph.inputs()) {
    const Node& input = graph.node(v);
    if (input.role != InputRole::random) continue;
    KILN_CHECK(!random_input, "verify: two random inputs (\"{}\" and \"{}\")", random_input->name, input.name);
    random_input = &input;
    const TensorType& type = input.outputs.at(0);
    KILN_CHECK(type.dtype == DType::i64 && type.shape == Shape{2} && type.device.is_cpu() && !type.wrapped_number,
               "verify: the random input \"{}\" is {}; it must be i64[2] (seed, offset) on the CPU", input.name,
               type.str());
  }
  for (const Node& node : graph.nodes())
    if (node.kind == NodeKind::op && node.def && node.def->random && !node.attrs.has("seed")) {
      KILN_CHECK(random_input, "verify: random op {} draws from the random input, which the graph lacks", node.op);
      KILN_CHECK(node.attrs.has("offset") && std::holds_alternative<int64_t>(node.attrs.get("offset")),
                 "verify: random op {} needs an int offset (from the random input's), has {}", node.op,
                 attrs_text(node.attrs));
    }
  for (size_t i = 0; i < graph.outputs().size(); ++i)
    KILN_CHECK(exists(graph, graph.outputs()[i]), "verify: output {} (node {}, output {}) does not exist", i,
               graph.outputs()[i].node, graph.outputs()[i].output);

  std::set<Value> targets;
  for (const auto& [input, value] : graph.write_backs()) {
    KILN_CHECK(exists(graph, input) && graph.node(input).kind == NodeKind::input,
               "verify: a write-back targets node {}, which is not a graph input", input.node);
    const std::string& name = graph.node(input).name;
    KILN_CHECK(targets.insert(input).second, "verify: two write-backs to input \"{}\"", name);
    KILN_CHECK(exists(graph, value), "verify: the write-back to input \"{}\" writes node {} output {}, which does not exist",
               name, value.node, value.output);
    KILN_CHECK(graph.type(value) == graph.type(input), "verify: the write-back to input \"{}\" ({}) writes %{} of type {}",
               name, graph.type(input).str(), graph.value_number(value), graph.type(value).str());
  }
}

}  // namespace kiln::compiler
