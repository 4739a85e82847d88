// simplify: algebra and view identities (compiler/passes/passes.h). Each rule states the
// identity; the Rewriter applies it only where the replacement's type equals the node's
// exactly (so x+0 with x an integer and 0.0 a float, which promotes, stays, and so does
// fill(x, 0) + y where y broadcasts to x's shape). "0" is a constant or a tensor filled
// with 0: a training step that zero-fills .grad and adds the backward's gradient into it
// becomes the gradient itself.
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

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

// A zero pad's per-dim amounts (lo, hi), first dim first, for an input of `rank` dims;
// nullopt for a pad with another value, negative amounts (a crop) or no pad op at all.
std::optional<std::vector<std::pair<int64_t, int64_t>>> zero_pad_amounts(const Rewriter& rw, Value v) {
  if (!rw.is_op(v, "pad")) return std::nullopt;
  const Node& p = rw.producer(v);
  if (p.attrs.scalar("value").to_double() != 0.0) return std::nullopt;
  const std::vector<int64_t>& pads = p.attrs.ints("pads");
  const size_t rank = rw.type(v).shape.size();
  std::vector<std::pair<int64_t, int64_t>> amounts(rank, {0, 0});
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    if (pads[2 * i] < 0 || pads[2 * i + 1] < 0) return std::nullopt;
    amounts[rank - 1 - i] = {pads[2 * i], pads[2 * i + 1]};
  }
  return amounts;
}

// pad(a) + pad(b) where the two zero pads place a and b side by side along one dim (b starts
// where a ends, or the other way round) and pad no other dim: pad(cat(a, b)), one copy where
// there were two padded tensors and a sum. The backward of q, k, v sliced from one
// projection sums three such pads.
Replacement add_adjacent_pads(Rewriter& rw, const Candidate& c) {
  if (!alpha_is_one(c)) return std::nullopt;
  const auto pa = zero_pad_amounts(rw, c.inputs[0]), pb = zero_pad_amounts(rw, c.inputs[1]);
  if (!pa || !pb || pa->size() != pb->size()) return std::nullopt;
  int64_t dim = -1;
  for (size_t d = 0; d < pa->size(); ++d) {
    if ((*pa)[d] == std::pair<int64_t, int64_t>{0, 0} && (*pb)[d] == (*pa)[d]) continue;
    if (dim >= 0) return std::nullopt;
    dim = static_cast<int64_t>(d);
  }
  if (dim < 0) return std::nullopt;
  const Value a = rw.producer(c.inputs[0]).inputs.at(0), b = rw.producer(c.inputs[1]).inputs.at(0);
  const auto [a_lo, a_hi] = (*pa)[static_cast<size_t>(dim)];
  const auto [b_lo, b_hi] = (*pb)[static_cast<size_t>(dim)];
  const int64_t a_end = a_lo + rw.type(a).shape[static_cast<size_t>(dim)];
  const int64_t b_end = b_lo + rw.type(b).shape[static_cast<size_t>(dim)];
  Values pieces;
  int64_t lo = 0, hi = 0;
  if (a_end == b_lo) {
    pieces = {a, b}, lo = a_lo, hi = b_hi;
  } else if (b_end == a_lo) {
    pieces = {b, a}, lo = b_lo, hi = a_hi;
  } else {
    return std::nullopt;
  }
  const Value joined = rw.add_op1("cat", pieces, {{"dim", dim}}, c.source);
  std::vector<int64_t> pads(2 * pa->size() - 2 * static_cast<size_t>(dim), 0);
  pads[pads.size() - 2] = lo;
  pads[pads.size() - 1] = hi;
  return Values{rw.add_op1("pad", {joined}, {{"pads", pads}, {"value", Scalar(0.0)}}, c.source)};
}

// A pad by nothing is its input.
Replacement pad_nothing(Rewriter&, const Candidate& c) {
  for (int64_t p : c.attrs.ints("pads"))
    if (p != 0) return std::nullopt;
  return Values{c.inputs.at(0)};
}

// cat(cat(a, b), c) along one dim is cat(a, b, c).
Replacement cat_cat(Rewriter& rw, const Candidate& c) {
  const int64_t rank = static_cast<int64_t>(c.outputs.at(0).shape.size());
  auto wrapped = [rank](int64_t d) { return d < 0 ? d + rank : d; };
  const int64_t dim = wrapped(c.attrs.i("dim"));
  Values pieces;
  bool flattened = false;
  for (Value v : c.inputs) {
    if (rw.is_op(v, "cat") && wrapped(rw.producer(v).attrs.i("dim")) == dim &&
        static_cast<int64_t>(rw.type(v).shape.size()) == rank) {
      for (Value inner : rw.producer(v).inputs) pieces.push_back(inner);
      flattened = true;
    } else {
      pieces.push_back(v);
    }
  }
  if (!flattened) return std::nullopt;
  return Values{rw.add_op1("cat", pieces, {{"dim", dim}}, c.source)};
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
      {"add_adjacent_pads", {"add"}, add_adjacent_pads},
      {"pad_nothing", {"pad"}, pad_nothing},
      {"cat_cat", {"cat"}, cat_cat},
  };
  return rules;
}

Graph simplify(const Graph& graph, RewriteLog* log) { return rewrite(graph, simplify_rules(), log); }

}  // namespace kiln::compiler
