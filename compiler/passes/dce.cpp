// dead_code (compiler/passes/passes.h).
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace kiln::compiler {

std::vector<bool> live_nodes(const Graph& graph) {
  const std::vector<Node>& nodes = graph.nodes();
  std::vector<bool> live(nodes.size(), false);
  for (Value v : graph.inputs()) live[static_cast<size_t>(v.node)] = true;
  for (Value v : graph.outputs()) live[static_cast<size_t>(v.node)] = true;
  for (const auto& [input, value] : graph.write_backs()) live[static_cast<size_t>(value.node)] = true;
  // Inputs are defined before their users, so one sweep from the end reaches every live node.
  for (size_t i = nodes.size(); i-- > 0;) {
    if (!live[i]) continue;
    for (Value v : nodes[i].inputs)
      if (v.defined()) live[static_cast<size_t>(v.node)] = true;
  }
  return live;
}

bool dense(const Graph& g, Value v) {
  for (int hops = 0; hops < 2; ++hops) {
    const Node& n = g.node(v);
    if (n.kind != NodeKind::op || n.def == nullptr || n.def->kind == OpKind::compute) return true;
    if (n.op != "view") return false;
    v = n.inputs[0];
  }
  return false;
}

Graph dead_code(const Graph& graph, RewriteLog* log) {
  const std::vector<Node>& nodes = graph.nodes();
  const std::vector<bool> live = live_nodes(graph);
  if (log) {
    int64_t number = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!live[i]) log->push_back(fmt::format("dead_code: dropped %{} = {}", number, nodes[i].op));
      number += static_cast<int64_t>(nodes[i].outputs.size());
    }
  }
  static const std::vector<Rule> no_rules;
  return Rewriter(graph, no_rules, nullptr, &live).run();
}

}  // namespace kiln::compiler
