// simplify: algebra and view identities (compiler/passes/passes.h). Each rule states the
// identity; the Rewriter applies it only where the replacement's type equals the node's
// exactly (so x+0 with x an integer and 0.0 a float, which promotes, stays, and so does
// fill(x, 0) + y where y broadcasts to x's shape). "0" is a constant or a tensor filled
// with 0: a training step that zero-fills .grad and adds the backward's gradient into it
// becomes the gradient itself.
#include <cmath>

#include "compiler/passes/passes.h"

namespace kiln::compiler {

namespace {

// The operand is exactly `want` everywhere in its own dtype: a constant, or a tensor filled
// with it (a zeroed .grad before the backward adds into it).
bool constant_is(const Rewriter& rw, Value v, double want) {
  if (rw.is_op(v, "fill")) {
    const Scalar value = rw.producer(v).attrs.scalar("value");
    return scalar_tensor(value, rw.type(v).dtype).item().to_double() == want;
  }
  const std::optional<Scalar> s = rw.constant_value(v);
  return s && s->to_double() == want;
}

// add and sub scale their second operand by alpha (1 when absent).
std::optional<Scalar> alpha_of(const Candidate& c) { return c.attrs.optional_scalar("alpha"); }
bool alpha_is_finite(const Candidate& c) {
  const std::optional<Scalar> a = alpha_of(c);
  return !a || std::isfinite(a->to_double());
}
bool alpha_is_one(const Candidate& c) {
  const std::optional<Scalar> a = alpha_of(c);
  return !a || a->to_double() == 1.0;
}

// x + alpha*0 and x - alpha*0 (alpha finite: inf*0 would be NaN).
Replacement minus_or_plus_zero(Rewriter& rw, const Candidate& c) {
  if (constant_is(rw, c.inputs[1], 0.0) && alpha_is_finite(c)) return Values{c.inputs[0]};
  return std::nullopt;
}

// 0 + alpha*x, which is x only for alpha 1.
Replacement zero_plus(Rewriter& rw, const Candidate& c) {
  if (constant_is(rw, c.inputs[0], 0.0) && alpha_is_one(c)) return Values{c.inputs[1]};
  return std::nullopt;
}

Replacement times_one(Rewriter& rw, const Candidate& c) {
  if (constant_is(rw, c.inputs[1], 1.0)) return Values{c.inputs[0]};
  return std::nullopt;
}

Replacement one_times(Rewriter& rw, const Candidate& c) {
  if (constant_is(rw, c.inputs[0], 1.0)) return Values{c.inputs[1]};
  return std::nullopt;
}

Replacement neg_neg(Rewriter& rw, const Candidate& c) {
  if (!rw.is_op(c.inputs[0], "neg")) return std::nullopt;
  return Values{rw.producer(c.inputs[0]).inputs.at(0)};
}

// A node whose value is its input's: a copy in a pure graph, or a view, expand or cast that
// changes nothing. The type check makes "changes nothing" exact: same shape (the row-major
// view of a shape onto itself and an expand to its own shape are the identity) and dtype.
Replacement same_value(Rewriter&, const Candidate& c) { return Values{c.inputs.at(0)}; }

// clone(x) is x in a pure graph, except where x is a strided view (a permute, an expand, a
// slice, maybe under row-major views): eager code's reshape traced the clone because no view
// could take x, and a view that reads the clone needs its copy (a program runs views as
// eager views). Such a clone stays.
Replacement drop_clone(Rewriter& rw, const Candidate& c) {
  for (Value v = c.inputs.at(0);;) {
    const Node& p = rw.producer(v);
    if (p.kind != NodeKind::op || !p.def || p.def->kind != OpKind::view) break;
    if (p.op != "view") return std::nullopt;
    v = p.inputs.at(0);
  }
  return Values{c.inputs.at(0)};
}

bool is_identity_permutation(const std::vector<int64_t>& dims) {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// Non-negative dims (the attribute may count from the end).
std::vector<int64_t> wrapped_dims(const std::vector<int64_t>& dims) {
  std::vector<int64_t> out = dims;
  const auto n = static_cast<int64_t>(dims.size());
  for (int64_t& d : out)
    if (d < 0) d += n;
  return out;
}

Replacement identity_permute(Rewriter&, const Candidate& c) {
  if (!is_identity_permutation(wrapped_dims(c.attrs.ints("dims")))) return std::nullopt;
  return Values{c.inputs.at(0)};
}

// permute(permute(x, inner), outer): element i of the result is dim inner[outer[i]] of x.
Replacement permute_permute(Rewriter& rw, const Candidate& c) {
  if (!rw.is_op(c.inputs[0], "permute")) return std::nullopt;
  const Node& inner = rw.producer(c.inputs[0]);
  const std::vector<int64_t> in = wrapped_dims(inner.attrs.ints("dims"));
  const std::vector<int64_t> out = wrapped_dims(c.attrs.ints("dims"));
  std::vector<int64_t> composed(out.size());
  for (size_t i = 0; i < out.size(); ++i) composed[i] = in.at(static_cast<size_t>(out[i]));
  return Values{rw.add_op1("permute", {inner.inputs.at(0)}, {{"dims", composed}}, c.source)};
}

// view(view(x)): both are row-major reinterpretations of the same elements, so one view of x
// to the final (resolved) shape is the same value.
Replacement view_view(Rewriter& rw, const Candidate& c) {
  if (!rw.is_op(c.inputs[0], "view")) return std::nullopt;
  const Node& inner = rw.producer(c.inputs[0]);
  return Values{rw.add_op1("view", {inner.inputs.at(0)}, {{"shape", c.outputs.at(0).shape}}, c.source)};
}

}  // namespace

const std::vector<Rule>& simplify_rules() {
  static const std::vector<Rule> rules = {
      {"add_zero", {"add"}, minus_or_plus_zero},
      {"zero_add", {"add"}, zero_plus},
      {"sub_zero", {"sub"}, minus_or_plus_zero},
      {"mul_one", {"mul"}, times_one},
      {"one_mul", {"mul"}, one_times},
      {"div_one", {"div"}, times_one},
      {"neg_neg", {"neg"}, neg_neg},
      {"clone_identity", {"clone"}, drop_clone},
      {"view_same_shape", {"view"}, same_value},
      {"expand_same_shape", {"expand"}, same_value},
      {"cast_same_dtype", {"cast", "to_device"}, same_value},
      {"identity_permute", {"permute"}, identity_permute},
      {"permute_permute", {"permute"}, permute_permute},
      {"view_view", {"view"}, view_view},
  };
  return rules;
}

Graph simplify(const Graph& graph, RewriteLog* log) { return rewrite(graph, simplify_rules(), log); }

}  // namespace kiln::compiler
