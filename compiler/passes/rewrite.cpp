// The Rewriter: rebuilds a graph through a table of rules (compiler/passes/rewrite.h).
#include "compiler/passes/rewrite.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace kiln::compiler {

namespace {

// Rules that keep adding nodes that other rules rewrite again would never end; a table
// whose rules each make the graph smaller or simpler stays far below this.
constexpr int kMaxRuleDepth = 64;

bool same_types(const Graph& graph, const Values& values, const std::vector<TensorType>& types, bool any_layout) {
  if (values.size() != types.size()) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) return false;
    TensorType t = graph.type(values[i]);
    if (any_layout) t.layout = types[i].layout;
    if (!(t == types[i])) return false;
  }
  return true;
}

}  // namespace

Rewriter::Rewriter(const Graph& source, const std::vector<Rule>& rules, RewriteLog* log,
                   const std::vector<bool>* keep)
    : source_(source), rules_(rules), log_(log), keep_(keep) {
  KILN_CHECK(!keep || keep->size() == source.nodes().size(),
             "rewrite: the keep mask has {} entries for {} nodes", keep ? keep->size() : 0,
             source.nodes().size());
}

bool Rewriter::is_op(Value v, std::string_view op) const {
  const Node& n = producer(v);
  return n.kind == NodeKind::op && n.op == op;
}

bool Rewriter::is_constant(Value v) const { return v.defined() && producer(v).kind == NodeKind::constant; }

std::optional<Scalar> Rewriter::constant_value(Value v) const {
  if (!is_constant(v)) return std::nullopt;
  const TensorType& t = type(v);
  // Through a real 0-d tensor of the constant's dtype, so that the value is what the
  // kernels will read, rounding and truncation included.
  return scalar_tensor(producer(v).attrs.scalar("value"), t.dtype).item();
}

Values Rewriter::add_op(std::string_view op, Values inputs, Attrs attrs, std::string source) {
  const OpDef& def = find_op(op);
  std::vector<TensorMeta> metas;
  for (Value v : inputs) metas.push_back(v.defined() ? type(v).meta() : TensorMeta{.shape = {}, .defined = false});
  std::vector<TensorType> outputs;
  for (const TensorMeta& m : def.infer(metas, attrs)) outputs.push_back(TensorType::of(m));
  return place(Candidate{def, inputs, attrs, outputs, source});
}

Value Rewriter::add_op1(std::string_view op, Values inputs, Attrs attrs, std::string source) {
  Values outs = add_op(op, std::move(inputs), std::move(attrs), std::move(source));
  KILN_CHECK(outs.size() == 1, "rewrite: {} has {} outputs, add_op1 wants one", op, outs.size());
  return outs[0];
}

std::string Rewriter::describe(const Candidate& c) const {
  std::string s = c.op() + "(";
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (i) s += ", ";
    s += c.inputs[i].defined() ? fmt::format("%{}", out_.value_number(c.inputs[i])) : "none";
  }
  return s + ")";
}

// Offers the candidate to the rules, then adds it unchanged if none answers.
Values Rewriter::place(const Candidate& c) {
  KILN_CHECK(depth_ < kMaxRuleDepth, "rewrite: the rules keep rewriting the nodes they add (at {})", c.op());
  ++depth_;
  struct DepthGuard {
    int& depth;
    ~DepthGuard() { --depth; }
  } guard{depth_};
  for (const Rule& rule : rules_) {
    if (!rule.ops.empty() && std::find(rule.ops.begin(), rule.ops.end(), c.op()) == rule.ops.end()) continue;
    Replacement r = rule.apply(*this, c);
    if (!r || !same_types(out_, *r, c.outputs, relaxed_layout_)) continue;
    if (log_) {
      std::string replaced;
      for (size_t i = 0; i < r->size(); ++i)
        replaced += fmt::format("{}%{}", i ? ", " : "", out_.value_number((*r)[i]));
      std::string entry = fmt::format("{}: {} -> {}", rule.name, describe(c), replaced);
      if (c.old_number >= 0) entry += fmt::format(" [was %{}]", c.old_number);
      log_->push_back(std::move(entry));
    }
    return std::move(*r);
  }
  return out_.add_op(c.op(), c.inputs, c.attrs, c.source);
}

Graph Rewriter::run() {
  KILN_CHECK(!done_, "rewrite: a Rewriter runs once");
  done_ = true;
  const std::vector<Node>& nodes = source_.nodes();
  std::vector<Values>& mapped = mapped_;
  mapped.assign(nodes.size(), {});
  auto map = [&](Value v) { return this->mapped(v); };
  int64_t old_number = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    const int64_t number = old_number;
    old_number += static_cast<int64_t>(node.outputs.size());
    // Graph inputs are the calling convention: always copied.
    if (keep_ && !(*keep_)[i] && node.kind != NodeKind::input) continue;
    switch (node.kind) {
      case NodeKind::input:
        mapped[i] = {out_.add_input(node.name, node.outputs.at(0), node.role)};
        break;
      case NodeKind::constant:
        mapped[i] = {out_.add_constant(node.attrs.scalar("value"), node.outputs.at(0))};
        break;
      case NodeKind::op: {
        Values inputs;
        inputs.reserve(node.inputs.size());
        for (Value v : node.inputs) inputs.push_back(map(v));
        const OpDef& def = node.def ? *node.def : find_op(node.op);
        mapped[i] = place(Candidate{def, inputs, node.attrs, node.outputs, node.source, number});
        break;
      }
    }
  }
  // Outputs and write-backs keep the layout the caller sees (a copy back where a relaxed
  // rewrite changed it).
  auto as_before = [&](Value old_value) {
    const Value v = map(old_value);
    if (!relaxed_layout_ || !v.defined() || out_.type(v).layout == source_.type(old_value).layout) return v;
    const bool channels_last = source_.type(old_value).layout == MemoryFormat::channels_last;
    return out_.add_op1("clone", {v}, channels_last ? Attrs{{"channels_last", true}} : Attrs{}, "layout");
  };
  Values outputs;
  for (Value v : source_.outputs()) outputs.push_back(as_before(v));
  out_.set_outputs(std::move(outputs));
  for (const auto& [input, value] : source_.write_backs()) out_.add_write_back(map(input), as_before(value));
  return std::move(out_);
}

Value Rewriter::mapped(Value old) const {
  if (!old.defined()) return old;
  const Values& m = mapped_.at(static_cast<size_t>(old.node));
  KILN_CHECK(static_cast<size_t>(old.output) < m.size(),
             "rewrite: %{} of the old graph has no value in the new one (dropped, or not placed yet)",
             source_.value_number(old));
  return m[static_cast<size_t>(old.output)];
}

Graph rewrite(const Graph& graph, const std::vector<Rule>& rules, RewriteLog* log) {
  return Rewriter(graph, rules, log).run();
}

}  // namespace kiln::compiler
