// print(): the graph IR's text form (compiler/ir/graph.h describes it; parse.cpp reads it).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compiler/ir/graph.h"

namespace kiln::compiler {

namespace {

std::string value_text(const Graph& graph, Value v) {
  return v.defined() ? fmt::format("%{}", graph.value_number(v)) : std::string("none");
}

// "%6, %7 = " for a node's outputs ("" for a node without any).
std::string defined_values(const Graph& graph, int32_t index, const Node& node) {
  std::string s;
  for (size_t i = 0; i < node.outputs.size(); ++i)
    s += fmt::format("{}%{}", i ? ", " : "", graph.value_number(Value{index, static_cast<int32_t>(i)}));
  return s.empty() ? s : s + " = ";
}

std::string types_text(const Node& node) {
  std::string s;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (i) s += ", ";
    s += node.outputs[i].str();
  }
  return s;
}

// A source comment stays on its line whatever the traced program called itself, and
// reads back as printed (parse trims comments).
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  const size_t first = s.find_first_not_of(' ');
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(' ') - first + 1);
}

}  // namespace

std::string print(const Graph& graph, bool with_sources) {
  std::string out;
  for (size_t index = 0; index < graph.nodes().size(); ++index) {
    const Node& node = graph.nodes()[index];
    std::string line = defined_values(graph, static_cast<int32_t>(index), node);
    switch (node.kind) {
      case NodeKind::input:
        line += fmt::format("{} {} : {}", role_name(node.role), attr_text(AttrValue{node.name}),
                            types_text(node));
        break;
      case NodeKind::constant:
        line += fmt::format("constant {} : {}", attrs_text(node.attrs), types_text(node));
        break;
      case NodeKind::op: {
        std::vector<std::string> inputs;
        for (Value v : node.inputs) inputs.push_back(value_text(graph, v));
        const std::string attrs = attrs_text(node.attrs);
        line += fmt::format("{}({}){}{} : {}", node.op, fmt::join(inputs, ", "), attrs.empty() ? "" : " ", attrs,
                            types_text(node));
        break;
      }
    }
    if (const std::string source = one_line(node.source); with_sources && !source.empty()) {
      line += "  # ";
      line += source;
    }
    out += line + "\n";
  }
  out += "return";
  for (size_t i = 0; i < graph.outputs().size(); ++i) {
    out += i ? ", " : " ";
    out += value_text(graph, graph.outputs()[i]);
  }
  out += "\n";
  for (const auto& [input, value] : graph.write_backs())
    out += fmt::format("write {} <- {}\n", value_text(graph, input), value_text(graph, value));
  return out;
}

}  // namespace kiln::compiler
