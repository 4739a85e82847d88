#include "compiler/codegen/lower.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "core/ops/reduce.h"

namespace kiln::compiler::codegen {
namespace {

// The value `v` converted to dtype `d`, as a Scalar of the matching category.
Scalar convert(const Scalar& v, DType d) {
  if (d == DType::boolean) return Scalar(v.to<bool>());
  // The 16-bit floats round as the eager kernels round a number operand (through f32).
  if (d == DType::f16) return Scalar(static_cast<double>(static_cast<float>(Half(static_cast<float>(v.to_double())))));
  if (d == DType::bf16) return Scalar(static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(v.to_double())))));
  if (is_floating(d)) return Scalar(v.to_double());
  return Scalar(v.kind() == DType::f64 ? static_cast<int64_t>(v.to_double()) : v.to_int());
}

class Lowering {
 public:
  Lowering(const Graph& g, std::vector<int32_t> nodes, const char* what) : g_(g), what_(what) {
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    KILN_CHECK(!nodes.empty(), "{}: the group is empty", what_);
    for (int32_t n : nodes) {
      KILN_CHECK(n >= 0 && static_cast<size_t>(n) < g.nodes().size(), "{}: node {} is not in the graph",
                 what_, n);
      const Node& node = g.nodes()[static_cast<size_t>(n)];
      KILN_CHECK(node.kind == NodeKind::op, "{}: node {} is a graph {}, not an op", what_, n, node.op);
    }
    nodes_ = std::move(nodes);
    group_.insert(nodes_.begin(), nodes_.end());
  }

  // The group nodes whose value is used outside the group, in node order.
  std::vector<int32_t> used_outside() const {
    std::set<int32_t> used;
    for (size_t n = 0; n < g_.nodes().size(); ++n) {
      if (group_.contains(static_cast<int32_t>(n))) continue;
      for (const Value& v : g_.nodes()[n].inputs)
        if (v.defined() && group_.contains(v.node)) used.insert(v.node);
    }
    for (const Value& v : g_.outputs())
      if (group_.contains(v.node)) used.insert(v.node);
    for (const auto& wb : g_.write_backs())
      if (group_.contains(wb.second.node)) used.insert(wb.second.node);
    return {used.begin(), used.end()};
  }

  // Sets the iteration space: `space` in the graph's dim order, walked in order `perm`.
  void set_space(Shape space, std::vector<int32_t> perm, int32_t num_reduced) {
    space_ = std::move(space);
    perm_ = std::move(perm);
    k_.rank = static_cast<int32_t>(space_.size());
    k_.num_reduced = num_reduced;
    for (int32_t p : perm_) k_.shape.push_back(space_[static_cast<size_t>(p)]);
  }

  void add_output(int32_t node, std::vector<int32_t> dim_of) {
    Buffer b;
    b.name = fmt::format("out{}", k_.buffers.size());
    b.dtype = g_.nodes()[static_cast<size_t>(node)].outputs[0].dtype;
    b.output = true;
    b.dim_of = std::move(dim_of);
    b.node = node;
    k_.buffers.push_back(std::move(b));
  }

  // Lowers every group node but `skip` (the reduction, done by the caller).
  void lower_nodes(int32_t skip = -1) {
    for (int32_t n : nodes_) {
      if (n == skip) continue;
      const Node& node = g_.nodes()[static_cast<size_t>(n)];
      KILN_CHECK(node.def->kind == OpKind::compute,
                 "{}: view op {} (node %{}) cannot be inside a group: views are read through by "
                 "the group's inputs", what_, node.op, g_.value_number({n, 0}));
      KILN_CHECK(lowers_pointwise(*node.def), "{}: op {} (node %{}) is not an elementwise op the code "
                 "generator supports", what_, node.op, g_.value_number({n, 0}));
      const Shape& shape = node.outputs[0].shape;
      const Shape both[] = {shape, space_};
      KILN_CHECK(broadcast_shapes(both, what_) == space_,
                 "{}: {} (node %{}) of shape {} does not broadcast to the kernel's space {}", what_,
                 node.op, g_.value_number({n, 0}), shape_str(shape), shape_str(space_));
      int32_t e = lower_op(node);
      node_expr_[n] = cast(e, node.outputs[0].dtype);
      if (std::find(names_.begin(), names_.end(), node.op) == names_.end()) names_.push_back(node.op);
    }
  }

  int32_t expr_of(int32_t node) const { return node_expr_.at(node); }

  // An operand: a group value, an inlined constant or a load, converted to `dtype`.
  int32_t operand(Value v, DType dtype) { return cast(input(v), dtype); }

  int32_t constant(const Scalar& value, DType dtype) {
    return add({.kind = ExprKind::constant, .dtype = dtype, .value = convert(value, dtype)});
  }

  int32_t cast(int32_t e, DType to) {
    const Expr& x = k_.exprs[static_cast<size_t>(e)];
    if (x.dtype == to) return e;
    if (x.kind == ExprKind::constant) return constant(x.value, to);
    return add({.kind = ExprKind::cast, .dtype = to, .args = {e}});
  }

  int32_t op(std::string name, std::vector<int32_t> args, DType dtype) {
    return add({.kind = ExprKind::op, .dtype = dtype, .op = std::move(name), .args = std::move(args)});
  }

  int32_t add(Expr e) {
    std::string key = fmt::format("{}|{}|{}|{}|{}|{}", static_cast<int>(e.kind), e.dtype, e.op,
                                  fmt::join(e.args, ","), e.buffer, constant_text(e.value, e.dtype));
    if (e.kind == ExprKind::reduce) key += fmt::format("|#{}", k_.exprs.size());  // never merged
    auto [it, inserted] = interned_.emplace(std::move(key), static_cast<int32_t>(k_.exprs.size()));
    if (inserted) k_.exprs.push_back(std::move(e));
    return it->second;
  }

  // The kernel, or nothing (and `refusal` says why) when an iteration dim from
  // `first_input_size_dims_from` on is walked by no input.
  std::optional<Kernel> finish(int32_t first_input_size_dims_from, std::string& refusal) {
    for (int32_t k = first_input_size_dims_from; k < k_.rank; ++k) {
      int32_t from = -1;
      for (size_t b = 0; b < k_.buffers.size() && from < 0; ++b)
        if (!k_.buffers[b].output && !k_.buffers[b].broadcasts(k)) from = static_cast<int32_t>(b);
      if (from < 0) {
        refusal = fmt::format("{}: no input walks iteration dim {} (all broadcast there)", what_, k);
        return std::nullopt;
      }
      k_.size_from[static_cast<size_t>(k)] = {from, k_.buffers[static_cast<size_t>(from)].dim_of[static_cast<size_t>(k)]};
    }
    std::vector<std::string> shown(names_.begin(), names_.begin() + std::min<size_t>(names_.size(), 5));
    k_.name = fmt::format("{}", fmt::join(shown, "_"));
    remove_dead_exprs();
    return std::move(k_);
  }

  // Drops exprs no store needs (a constant before its conversion, say) and renumbers.
  void remove_dead_exprs() {
    std::vector<bool> live(k_.exprs.size(), false);
    for (const Store& s : k_.stores) live[static_cast<size_t>(s.expr)] = true;
    for (size_t e = k_.exprs.size(); e-- > 0;)
      if (live[e])
        for (int32_t a : k_.exprs[e].args) live[static_cast<size_t>(a)] = true;
    std::vector<int32_t> renumber(k_.exprs.size(), -1);
    std::vector<Expr> kept;
    for (size_t e = 0; e < k_.exprs.size(); ++e) {
      if (!live[e]) continue;
      renumber[e] = static_cast<int32_t>(kept.size());
      kept.push_back(std::move(k_.exprs[e]));
      for (int32_t& a : kept.back().args) a = renumber[static_cast<size_t>(a)];
    }
    k_.exprs = std::move(kept);
    for (Store& s : k_.stores) s.expr = renumber[static_cast<size_t>(s.expr)];
  }

  Kernel& kernel() { return k_; }
  const std::vector<int32_t>& nodes() const { return nodes_; }
  void add_name(const std::string& n) { names_.push_back(n); }

 private:
  DType promoted(const Node& node, size_t first = 0) const {
    std::vector<TensorMeta> metas;
    for (size_t i = first; i < node.inputs.size(); ++i) metas.push_back(g_.type(node.inputs[i]).meta());
    return result_type(metas);
  }

  // The op's element, as its category (OpDef::elementwise) says to compute it.
  int32_t lower_op(const Node& node) {
    const OpDef& def = *node.def;
    const Attrs& a = node.attrs;
    auto in = [&](size_t i, DType d) { return operand(node.inputs[i], d); };
    const DType out = node.outputs[0].dtype;
    switch (def.elementwise) {
      case Elementwise::same:
      case Elementwise::floating: {
        DType c = promoted(node);
        if (def.elementwise == Elementwise::floating && !is_floating(c)) c = kDefaultFloat;
        std::vector<int32_t> args;
        for (size_t i = 0; i < node.inputs.size(); ++i) args.push_back(in(i, c));
        // add and sub scale their second operand by `alpha`.
        if (args.size() == 2 && a.has("alpha")) args[1] = op("mul", {args[1], constant(a.scalar("alpha"), c)}, c);
        if (def.scalar_args)
          for (const Scalar& v : def.scalar_args(a))
            args.push_back(constant(v, v.kind() == DType::boolean ? DType::boolean : c));
        return op(def.name, std::move(args), c);
      }
      case Elementwise::compare: {
        const DType c = promoted(node);
        return op(def.name, {in(0, c), in(1, c)}, DType::boolean);
      }
      case Elementwise::logical: {
        std::vector<int32_t> args;
        for (size_t i = 0; i < node.inputs.size(); ++i) args.push_back(in(i, DType::boolean));
        return op(def.name, std::move(args), DType::boolean);
      }
      case Elementwise::select: {
        const DType c = promoted(node, 1);
        return op(def.name, {in(0, DType::boolean), in(1, c), in(2, c)}, c);
      }
      case Elementwise::clamp: {
        int32_t x = in(0, out);
        if (auto lo = a.optional_scalar("min")) x = op("maximum", {x, constant(*lo, out)}, out);
        if (auto hi = a.optional_scalar("max")) x = op("minimum", {x, constant(*hi, out)}, out);
        return x;
      }
      case Elementwise::convert: return in(0, out);
      case Elementwise::fill: return constant(a.scalar("value"), out);  // the input gives only the shape
      case Elementwise::none:
      case Elementwise::opaque: break;
    }
    fail("{}: op {} is not supported", what_, def.name);
  }

  // A value read by the group: its expr when the group computes it, a constant, or a load
  // of the value behind the view nodes that lead to it.
  int32_t input(Value v) {
    if (group_.contains(v.node)) {
      auto it = node_expr_.find(v.node);
      KILN_CHECK(it != node_expr_.end(), "{}: node {} is read before it is computed", what_, v.node);
      return it->second;
    }
    const Node* node = &g_.node(v);
    std::vector<ViewStep> steps;
    Value base = v;
    while (node->kind == NodeKind::op && node->def->kind == OpKind::view) {
      steps.insert(steps.begin(), ViewStep{node->def, node->attrs});
      base = node->inputs[0];
      node = &g_.node(base);
    }
    // Any view of a 0-d constant is that constant everywhere.
    if (node->kind == NodeKind::constant) return constant(node->attrs.scalar("value"), g_.type(v).dtype);

    const std::string key = fmt::format("{}:{}", v.node, v.output);
    auto found = buffer_of_.find(key);
    int32_t buffer;
    if (found != buffer_of_.end()) {
      buffer = found->second;
    } else {
      const TensorType& type = g_.type(v);
      Buffer b;
      b.name = fmt::format("in{}", k_.buffers.size() - static_cast<size_t>(k_.num_outputs()));
      b.dtype = type.dtype;
      b.views = std::move(steps);
      b.node = base.node;
      b.output_index = base.output;
      const int64_t lead = static_cast<int64_t>(space_.size()) - static_cast<int64_t>(type.shape.size());
      for (int32_t p : perm_) {
        const int64_t td = p - lead;
        const bool bcast = td < 0 || (type.shape[static_cast<size_t>(td)] == 1 && space_[static_cast<size_t>(p)] != 1);
        b.dim_of.push_back(bcast ? -1 : static_cast<int32_t>(td));
      }
      buffer = static_cast<int32_t>(k_.buffers.size());
      k_.buffers.push_back(std::move(b));
      buffer_of_.emplace(key, buffer);
    }
    return add({.kind = ExprKind::load, .dtype = g_.type(v).dtype, .buffer = buffer});
  }

  const Graph& g_;
  const char* what_;
  std::vector<int32_t> nodes_;
  std::set<int32_t> group_;
  Kernel k_;
  Shape space_;
  std::vector<int32_t> perm_;
  std::map<int32_t, int32_t> node_expr_;
  std::map<std::string, int32_t> interned_;
  std::map<std::string, int32_t> buffer_of_;
  std::vector<std::string> names_;
};

Scalar lowest(DType d, bool max) {
  switch (d) {
    case DType::boolean: return Scalar(!max);
    case DType::u8: return Scalar(max ? 0 : 255);
    case DType::i32: return max ? Scalar(std::numeric_limits<int32_t>::min()) : Scalar(std::numeric_limits<int32_t>::max());
    case DType::i64: return max ? Scalar(std::numeric_limits<int64_t>::min()) : Scalar(std::numeric_limits<int64_t>::max());
    default: return Scalar(max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity());
  }
}

}  // namespace

Kernel lower_pointwise(const Graph& g, const std::vector<int32_t>& nodes) {
  Lowering l(g, nodes, "lower_pointwise");
  const std::vector<int32_t> outputs = l.used_outside();
  KILN_CHECK(!outputs.empty(), "lower_pointwise: no value of the group is used outside it");
  const TensorType& first = g.nodes()[static_cast<size_t>(outputs[0])].outputs[0];
  const Shape space = first.shape;
  // The loops walk the first output's memory in order: N, H, W, C for a channels_last one,
  // so that the innermost loop is the unit-stride one.
  std::vector<int32_t> order(space.size());
  for (size_t d = 0; d < space.size(); ++d) order[d] = static_cast<int32_t>(d);
  if (first.layout == MemoryFormat::channels_last && space.size() == 4) order = {0, 2, 3, 1};
  l.set_space(space, order, 0);
  for (int32_t n : outputs) {
    const Shape& shape = g.nodes()[static_cast<size_t>(n)].outputs[0].shape;
    KILN_CHECK(shape == space, "lower_pointwise: the group's outputs have different shapes ({} and {})",
               shape_str(space), shape_str(shape));
    l.add_output(n, order);
  }
  l.lower_nodes();
  Kernel& k = l.kernel();
  for (size_t b = 0; b < outputs.size(); ++b)
    k.stores.push_back({static_cast<int32_t>(b), l.expr_of(outputs[b])});
  k.size_from.resize(space.size());
  for (size_t d = 0; d < space.size(); ++d) k.size_from[d] = {0, order[d]};
  std::string refusal;  // the sizes come from the first output: no dim is left to an input
  return *l.finish(k.rank, refusal);
}

bool lowers_pointwise(const OpDef& op) {
  return op.kind == OpKind::compute && op.elementwise != Elementwise::none && op.elementwise != Elementwise::opaque;
}

bool lowers_reduction(const OpDef& op) {
  return op.reduction == Reduction::sum || op.reduction == Reduction::mean || op.reduction == Reduction::amax ||
         op.reduction == Reduction::amin;
}

std::optional<Kernel> try_lower_reduction(const Graph& g, const std::vector<int32_t>& nodes, std::string& refusal) {
  Lowering l(g, nodes, "lower_reduction");
  auto refuse = [&](std::string why) -> std::optional<Kernel> {
    refusal = std::move(why);
    return std::nullopt;
  };
  // The reduction: the group's last node that is one (side outputs may follow it).
  int32_t r = l.nodes().back();
  for (int32_t n : l.nodes())
    if (lowers_reduction(*g.nodes()[static_cast<size_t>(n)].def)) r = n;
  const Node& red = g.nodes()[static_cast<size_t>(r)];
  if (!lowers_reduction(*red.def))
    return refuse(fmt::format("lower_reduction: the group must hold a reduction the code generator supports "
                              "(sum, mean, amax, amin); its last node is {}", red.op));
  const Shape space = g.type(red.inputs[0]).shape;
  // Other values used outside are side outputs, stored as the inner loops walk them: they
  // must span the reduction's whole input space and not depend on its result.
  const std::vector<int32_t> used = l.used_outside();
  if (std::find(used.begin(), used.end(), r) == used.end())
    return refuse(fmt::format("lower_reduction: the {}'s result is not used outside the group", red.op));
  std::vector<int32_t> side;
  for (int32_t n : used) {
    if (n == r) continue;
    const Node& node = g.nodes()[static_cast<size_t>(n)];
    if (node.outputs.size() != 1 || node.outputs[0].shape != space)
      return refuse(fmt::format("lower_reduction: {} (node %{}) is used outside the group but is not a value of "
                                "the {}'s input space {}", node.op, g.value_number({n, 0}),
                                red.op, shape_str(space)));
    side.push_back(n);
  }
  for (int32_t n : l.nodes())
    for (Value v : g.nodes()[static_cast<size_t>(n)].inputs)
      if (v.node == r)
        return refuse(fmt::format("lower_reduction: {} (node %{}) reads the {}'s result inside the group",
                                  g.nodes()[static_cast<size_t>(n)].op, g.value_number({n, 0}), red.op));
  const std::vector<bool> reduced =
      reduced_dims(space, red.attrs.has("dims") ? red.attrs.ints("dims") : DimList{}, "lower_reduction");
  const bool keepdim = red.attrs.has("keepdim") && red.attrs.b("keepdim");
  std::vector<int32_t> perm;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t d = 0; d < space.size(); ++d)
      if (reduced[d] == (pass == 1)) perm.push_back(static_cast<int32_t>(d));
  const int32_t num_reduced = static_cast<int32_t>(std::count(reduced.begin(), reduced.end(), true));
  if (num_reduced == 0)
    return refuse(fmt::format("lower_reduction: {} of shape {} reduces nothing", red.op, shape_str(space)));
  const int32_t kept = static_cast<int32_t>(space.size()) - num_reduced;
  l.set_space(space, perm, num_reduced);

  std::vector<int32_t> out_dims(space.size(), -1);
  for (int32_t k = 0; k < kept; ++k) out_dims[static_cast<size_t>(k)] = keepdim ? perm[static_cast<size_t>(k)] : k;
  l.add_output(r, out_dims);
  for (int32_t n : side) l.add_output(n, perm);
  l.lower_nodes(r);

  const DType out = red.outputs[0].dtype;
  const Reduction kind = red.def->reduction;
  const bool sum = kind == Reduction::sum || kind == Reduction::mean;
  const DType acc = sum ? (is_floating(out) ? DType::f64 : DType::i64) : out;
  const int32_t x = l.cast(l.operand(red.inputs[0], out), acc);
  const bool max = kind == Reduction::amax;
  const Scalar identity = sum ? Scalar(0) : lowest(acc, max);
  int32_t result = l.add({.kind = ExprKind::reduce, .dtype = acc, .op = sum ? "add" : max ? "maximum" : "minimum",
                          .args = {x}, .value = Scalar(0)});
  l.kernel().exprs[static_cast<size_t>(result)].value = identity;
  if (kind == Reduction::mean)
    result = l.op("div", {result, l.add({.kind = ExprKind::reduce_count, .dtype = acc})}, acc);
  l.add_name(red.op);
  Kernel& k = l.kernel();
  k.stores.push_back({0, l.cast(result, out)});
  for (size_t i = 0; i < side.size(); ++i) k.stores.push_back({static_cast<int32_t>(i + 1), l.expr_of(side[i])});
  k.size_from.resize(space.size());
  for (int32_t d = 0; d < kept; ++d) k.size_from[static_cast<size_t>(d)] = {0, out_dims[static_cast<size_t>(d)]};
  return l.finish(kept, refusal);
}

Kernel lower_reduction(const Graph& g, const std::vector<int32_t>& nodes) {
  std::string refusal;
  std::optional<Kernel> k = try_lower_reduction(g, nodes, refusal);
  if (!k) fail("{}", refusal);
  return std::move(*k);
}

}  // namespace kiln::compiler::codegen
