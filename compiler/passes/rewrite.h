#pragma once
// The machinery every graph pass is built on (../../shared/COMPILER.md, "Passes as rules").
//
// Graphs are append-only and hash-consed, so a pass never edits one: it builds a new graph.
// A Rewriter walks the old graph's nodes in definition order and copies each into the new
// graph through a value map (old value -> new value). Inputs are copied where they stand, so
// they keep their names, roles and order, and a graph that no rule changes prints exactly as
// before. Each op node is first offered, with its inputs already mapped, to the rules of the
// table in order; the first rule that answers gives the node's replacement: values already in
// the new graph, or nodes it added through the Rewriter. Nodes a rule adds are offered to the
// rules too, so rewrites compose within one walk (permute(permute(x)) -> permute(x) -> x).
// Outputs and write-backs are mapped last. Hash-consing in the new graph makes CSE free: a
// copied node whose mapped inputs equal an existing node's is that node.
//
// A rule is small and named, like a row of tinygrad's PatternMatcher:
//
//   Rule{"neg_neg", {"neg"}, [](Rewriter& rw, const Candidate& c) -> Replacement {
//     if (!rw.is_op(c.inputs[0], "neg")) return std::nullopt;
//     return Values{rw.producer(c.inputs[0]).inputs[0]};
//   }}
//
// A replacement must have exactly the replaced values' types (dtype, shape, device, layout,
// wrapped-number flag); one that does not is not applied and the next rule is tried, so a
// rule states the algebra and the rewriter keeps types exact. Nodes a declined rule added are
// left for dead_code. Every applied rewrite is logged for the dumps as
//   "neg_neg: neg(%6) -> %3 [was %9]"
// (the rule, the node's op and inputs and its replacement, numbered in the graph being built;
// a node from the old graph also says its number there).
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace kiln::compiler {

using Values = std::vector<Value>;
using Replacement = std::optional<Values>;
using RewriteLog = std::vector<std::string>;

// An op node about to enter the new graph: from the old graph, or added by a rule.
struct Candidate {
  const OpDef& def;
  const std::vector<Value>& inputs;        // values of the new graph (may hold `none`)
  const Attrs& attrs;
  const std::vector<TensorType>& outputs;  // the types a replacement must have
  const std::string& source;
  int64_t old_number = -1;  // its first value's number in the old graph; -1 when a rule added it
  const std::string& op() const { return def.name; }
};

class Rewriter;
using RuleFn = std::function<Replacement(Rewriter&, const Candidate&)>;

struct Rule {
  std::string name;              // what the log says
  std::vector<std::string> ops;  // the ops it looks at; empty: every op node
  RuleFn apply;
};

class Rewriter {
 public:
  // `keep`, when given, says per old node whether to copy it (one per node of `source`); the
  // kept nodes must include every input of a kept node, every output and write-back.
  Rewriter(const Graph& source, const std::vector<Rule>& rules, RewriteLog* log = nullptr,
           const std::vector<bool>* keep = nullptr);
  // Builds and returns the new graph (once).
  Graph run();
  // Lets replacements differ from the replaced values in layout (the layout pass, whose
  // point is to change layouts; dtype, shape and device must still match). Nodes copied
  // unchanged take the layout their shape rule gives for their new inputs.
  void allow_layout_changes() { relaxed_layout_ = true; }

  // For rules, about the graph being built.
  const Graph& graph() const { return out_; }
  const TensorType& type(Value v) const { return out_.type(v); }
  const Node& producer(Value v) const { return out_.node(v); }
  bool is_op(Value v, std::string_view op) const;
  bool is_constant(Value v) const;
  // A constant's value as its own dtype holds it (a constant {value=$0.3} : i64[] is 0).
  std::optional<Scalar> constant_value(Value v) const;
  // Adds nodes to the graph being built; an op goes through the rules first.
  Value add_constant(Scalar value, TensorType type) { return out_.add_constant(value, std::move(type)); }
  Values add_op(std::string_view op, Values inputs, Attrs attrs = {}, std::string source = {});
  Value add_op1(std::string_view op, Values inputs, Attrs attrs = {}, std::string source = {});
  // The new graph's value for a value of the old graph already placed (a node before the one
  // being rewritten): for rules that replace a node by work on values it does not read.
  Value mapped(Value old) const;

 private:
  Values place(const Candidate& candidate);
  std::string describe(const Candidate& candidate) const;

  const Graph& source_;
  const std::vector<Rule>& rules_;
  RewriteLog* log_;
  const std::vector<bool>* keep_;
  Graph out_;
  std::vector<Values> mapped_;  // per old node: its values in out_ (empty until placed)
  int depth_ = 0;
  bool done_ = false;
  bool relaxed_layout_ = false;
};

// Rebuilds `graph` through `rules` (see above).
Graph rewrite(const Graph& graph, const std::vector<Rule>& rules, RewriteLog* log = nullptr);

}  // namespace kiln::compiler
