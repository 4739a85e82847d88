// gemm_epilogues: additions a GEMM can do itself (compiler/passes/passes.h). A GEMM computes
// C = alpha * A @ B + beta * C, so x + mm(a, b), where x has the product's own shape and
// type, is addmm(x, a, b): the product lands on x's values without a second pass, and with
// no temporary the product's size. That is `grad += g` of gradient accumulation (a Linear
// weight's gradient is one mm) and a full-size residual add. A convolution's weight
// gradient is a sum of GEMMs too, so x + conv2d_backward_weight(g, input) is
// conv2d_backward_weight(g, input, x), which sums into x (kernels/cpu/conv.cpp).
// Where the sum is written back into x, the program runs the op in place (Program's
// in-place write-backs).
//
// The rule reads the old graph to know that the product has no other reader (it would be
// computed twice otherwise). Sums round differently: the kernel adds x before or between
// its blocks instead of once at the end, so the result agrees to rounding, not bit for bit.
#include <algorithm>
#include <array>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include "compiler/passes/passes.h"

namespace kiln::compiler {

namespace {

// The products the rule folds an addition into: matrix products, and weight gradients of
// convolutions not already adding into something.
bool is_product_op(const Node& node) {
  return node.kind == NodeKind::op && (node.op == "matmul" || node.op == "mm" ||
                                       (node.op == "conv2d_backward_weight" && node.inputs.size() == 2));
}

// The facts about the old graph the rule needs: per value number of an add node, whether
// each operand is a product that nothing else reads (not another node, an output or a
// write-back).
class SoleProducts {
 public:
  explicit SoleProducts(const Graph& g) {
    // Readers among the live nodes only: the passes before leave the nodes they bypassed
    // (a transposed gradient's permutes) for dead_code, and those read nothing at run time.
    const std::vector<bool> live = live_nodes(g);
    std::vector<int32_t> readers(g.nodes().size(), 0);  // products have one output
    auto read = [&](Value v) {
      if (v.defined()) ++readers[static_cast<size_t>(v.node)];
    };
    for (size_t n = 0; n < g.nodes().size(); ++n)
      if (live[n])
        for (Value v : g.nodes()[n].inputs) read(v);
    for (Value v : g.outputs()) read(v);
    for (const auto& wb : g.write_backs()) read(wb.second);
    for (size_t n = 0; n < g.nodes().size(); ++n) {
      const Node& node = g.nodes()[n];
      if (!live[n] || node.kind != NodeKind::op || node.op != "add" || node.inputs.size() != 2) continue;
      std::array<bool, 2> sole{};
      for (size_t i = 0; i < 2; ++i) {
        const Value v = node.inputs[i];
        const Node& maker = g.node(v);
        sole[i] = is_product_op(maker) && readers[static_cast<size_t>(v.node)] == 1;
      }
      sole_[g.value_number({static_cast<int32_t>(n), 0})] = sole;
    }
  }
  bool operand_is_sole_product(const Candidate& c, size_t i) const {
    const auto it = sole_.find(c.old_number);
    return it != sole_.end() && it->second[i];
  }

 private:
  std::unordered_map<int64_t, std::array<bool, 2>> sole_;
};

// x + p or p + x, p a product nothing else reads, x and p of the sum's type (no broadcast,
// no promotion), f32 or f64, the add scaling by 1:
//   p = mm(a, b) or matmul(a, b), 2-d operands  -> addmm(x, a, b)
//   p = conv2d_backward_weight(g, input)         -> conv2d_backward_weight(g, input, x)
Replacement accumulate_into_product(Rewriter& rw, const Candidate& c, const SoleProducts& sole) {
  if (c.old_number < 0 || c.inputs.size() != 2) return std::nullopt;
  if (const std::optional<Scalar> alpha = c.attrs.optional_scalar("alpha"); alpha && alpha->to_double() != 1.0)
    return std::nullopt;
  const TensorType& sum = c.outputs.at(0);
  if (sum.dtype != DType::f32 && sum.dtype != DType::f64) return std::nullopt;
  for (size_t i = 0; i < 2; ++i) {
    const Value product = c.inputs[i], x = c.inputs[1 - i];
    // The product and x both of the sum's type: no broadcast, no promotion on either side
    // (the ops' shape rules would refuse the rewrite otherwise).
    if (!is_product_op(rw.producer(product)) || !sole.operand_is_sole_product(c, i) || rw.type(x) != sum ||
        rw.type(product) != sum)
      continue;
    const Node& p = rw.producer(product);
    const Value a = p.inputs.at(0), b = p.inputs.at(1);
    if (p.op == "conv2d_backward_weight") return Values{rw.add_op1(p.op, {a, b, x}, p.attrs, c.source)};
    if (rw.type(a).shape.size() != 2 || rw.type(b).shape.size() != 2) continue;
    return Values{rw.add_op1("addmm", {x, a, b}, {}, c.source)};
  }
  return std::nullopt;
}

}  // namespace

Graph gemm_epilogues(const Graph& graph, RewriteLog* log) {
  const SoleProducts sole(graph);
  const std::vector<Rule> rules{
      {"accumulate_into_product", {"add"},
       [&sole](Rewriter& rw, const Candidate& c) { return accumulate_into_product(rw, c, sole); }}};
  return rewrite(graph, rules, log);
}

// ---- gemm_activations: a Linear's activation in cuBLASLt's epilogue ----
//
// A Linear followed by a tanh GELU or a ReLU, in the traced step (x: [..., K], W: [K, N],
// b: [N]; the product maybe addmm over flattened rows, under autocast):
//
//   pre = add(matmul(x, W), b)  or  addmm(b, view(x, [M, K]), W)
//   y   = gelu(pre) {tanh}      or  relu(pre)                     (maybe through views)
//   dp  = gelu_backward(matmul(g, V), pre) {tanh}                 (V: [K2, N]; maybe a view)
//   db  = sum(dp, every dim but the last)                         (the bias's gradient)
//
// becomes addmm_activation(b, view(x, [M, K]), W) -> (y, pre) (relu: y alone, when nothing
// but the relu reads pre) and mm_gelu_backward(view(g, [M, K2]), V, view(pre, [M, N])) ->
// (dp, db), each viewed back to the shape it replaces. On CUDA these are cuBLASLt's
// GELU_AUX_BIAS, RELU_BIAS and DGELU_BGRAD epilogues: the product's result is never written
// and read back by a pointwise kernel, and the bias gradient's column sum comes with the
// backward product.

namespace {

bool applies(const TensorType& t, GemmActivations where) {
  if (where == GemmActivations::never || !is_floating(t.dtype)) return false;
  return where == GemmActivations::always ? (t.device.is_cpu() || t.device.is_cuda()) : t.device.is_cuda();
}

bool is_product(const Node& n) { return n.kind == NodeKind::op && (n.op == "matmul" || n.op == "mm"); }

bool scales_by_one(const Attrs& attrs, const char* name) {
  const std::optional<Scalar> s = attrs.optional_scalar(name);
  return !s || s->to_double() == 1.0;
}

// The operands of a biased product `pre` in graph g: x [..., K] (the rows), W [K, N] and b
// [N], all of pre's dtype and device. `sole` says whether the product inside an add has no
// other reader (the old graph's facts; in the new graph the rule already knows).
struct BiasedProduct {
  Value x, w, b;
  int64_t m = 0, k = 0, n = 0;
};
// An add or addmm node (op, inputs, attrs) of type t whose inputs are values of g: a node of
// g, or a rule's candidate about to enter it.
template <class SoleReader>
std::optional<BiasedProduct> biased_product(const Graph& g, const std::string& op, const std::vector<Value>& inputs,
                                            const Attrs& attrs, const TensorType& t, SoleReader sole) {
  BiasedProduct p;
  if (op == "addmm" && inputs.size() == 3) {
    if (!scales_by_one(attrs, "beta") || !scales_by_one(attrs, "alpha")) return std::nullopt;
    p.b = inputs[0], p.x = inputs[1], p.w = inputs[2];
  } else if (op == "add" && inputs.size() == 2 && scales_by_one(attrs, "alpha")) {
    const int side = is_product(g.node(inputs[0])) ? 0 : is_product(g.node(inputs[1])) ? 1 : -1;
    if (side < 0 || g.type(inputs[static_cast<size_t>(side)]) != t || !sole(inputs[static_cast<size_t>(side)]))
      return std::nullopt;
    const Node& product = g.node(inputs[static_cast<size_t>(side)]);
    p.x = product.inputs.at(0), p.w = product.inputs.at(1), p.b = inputs[static_cast<size_t>(1 - side)];
  } else {
    return std::nullopt;
  }
  const TensorType &x = g.type(p.x), &w = g.type(p.w), &b = g.type(p.b);
  if (x.shape.size() < 2 || w.shape.size() != 2 || b.shape != Shape{w.shape[1]}) return std::nullopt;
  // The rows are viewed as [M, K] when x has more dims: x must allow it.
  if (x.shape.size() > 2 && !dense(g, p.x)) return std::nullopt;
  for (const TensorType* o : {&x, &w, &b})
    if (o->dtype != t.dtype || o->device != t.device) return std::nullopt;
  p.k = w.shape[0], p.n = w.shape[1], p.m = numel_of(x.shape) / std::max<int64_t>(p.k, 1);
  if (x.shape.back() != p.k || numel_of(t.shape) != p.m * p.n || t.shape.back() != p.n) return std::nullopt;
  return p;
}
// The value `pre` of g as a biased product.
template <class SoleReader>
std::optional<BiasedProduct> biased_product(const Graph& g, Value pre, SoleReader sole) {
  const Node& node = g.node(pre);
  if (node.kind != NodeKind::op) return std::nullopt;
  return biased_product(g, node.op, node.inputs, node.attrs, g.type(pre), sole);
}

// The value under a chain of reshapes (view ops) of v.
Value under_views(const Graph& g, Value v) {
  while (g.node(v).kind == NodeKind::op && g.node(v).op == "view") v = g.node(v).inputs.at(0);
  return v;
}

// The value under a chain of reshapes of v in which v and every value down to the end has
// one reader; none when one has more.
template <class SoleReader>
Value under_sole_views(const Graph& g, Value v, SoleReader sole) {
  if (!sole(v)) return {};
  while (g.node(v).kind == NodeKind::op && g.node(v).op == "view") {
    v = g.node(v).inputs.at(0);
    if (!sole(v)) return {};
  }
  return v;
}

Value reshaped(Rewriter& rw, Value v, const Shape& shape) {
  if (rw.type(v).shape == shape) return v;
  return rw.add_op1("view", {v}, {{"shape", std::vector<int64_t>(shape.begin(), shape.end())}});
}

// The old graph's facts the rules need: which biased products a tanh GELU reads, which ReLUs
// read a biased product nothing else reads, and which tanh GELU backward ops take a product
// nothing else reads.
class ActivationSites {
 public:
  ActivationSites(const Graph& g, GemmActivations where) {
    const std::vector<bool> live = live_nodes(g);
    std::unordered_map<int64_t, int32_t> readers;
    for (size_t n = 0; n < g.nodes().size(); ++n)
      if (live[n] && g.nodes()[n].kind == NodeKind::op)
        for (Value v : g.nodes()[n].inputs)
          if (v.defined()) ++readers[g.value_number(v)];
    for (Value v : g.outputs()) readers[g.value_number(v)] += 2;  // an escaping value is never sole
    for (const auto& wb : g.write_backs()) readers[g.value_number(wb.second)] += 2;
    const auto sole = [&](Value v) { return readers[g.value_number(v)] == 1; };
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& node = g.nodes()[i];
      if (!live[i] || node.kind != NodeKind::op || node.inputs.empty() || !node.inputs[0].defined()) continue;
      const Value in = node.inputs[0], self{static_cast<int32_t>(i), 0};
      if (!applies(g.type(in), where)) continue;
      if (node.op == "gelu" && node.attrs.str("approximate") == "tanh") {
        const Value pre = under_views(g, in);
        if (biased_product(g, pre, sole)) gelu_pre_.insert(g.value_number(pre));
      } else if (node.op == "relu") {
        const Value v = under_sole_views(g, in, sole);
        if (v.defined() && biased_product(g, v, sole)) relus_.insert(g.value_number(self));
      } else if (node.op == "gelu_backward" && node.attrs.str("approximate") == "tanh" && node.inputs.size() == 2 &&
                 g.type(node.inputs[1]) == g.type(in) && g.type(in) == node.outputs[0]) {
        const Value p = under_sole_views(g, in, sole);
        if (!p.defined() || !is_product(g.node(p))) continue;
        const Node& product = g.node(p);
        const TensorType &a = g.type(product.inputs.at(0)), &w = g.type(product.inputs.at(1));
        // g and pre are viewed as [M, K2] and [M, N] when they have more dims.
        const bool viewable = a.shape.size() == 2 || dense(g, product.inputs.at(0));
        const bool pre_viewable = g.type(node.inputs[1]).shape.size() == 2 || dense(g, node.inputs[1]);
        if (a.shape.size() >= 2 && w.shape.size() == 2 && a.dtype == w.dtype && viewable && pre_viewable)
          gelu_backward_.insert(g.value_number(self));
      }
    }
  }
  bool gelu_pre(int64_t old_number) const { return gelu_pre_.count(old_number) > 0; }
  bool relu(int64_t old_number) const { return relus_.count(old_number) > 0; }
  bool gelu_backward(int64_t old_number) const { return gelu_backward_.count(old_number) > 0; }

 private:
  std::set<int64_t> gelu_pre_, relus_, gelu_backward_;
};

// addmm_activation over a biased product of the graph being built (the rules have checked
// it in the old graph).
Values activation_op(Rewriter& rw, const BiasedProduct& p, const char* activation, const std::string& source) {
  const Value rows = reshaped(rw, p.x, Shape{p.m, p.k});
  return rw.add_op("addmm_activation", {p.b, rows, p.w}, {{"activation", std::string(activation)}}, source);
}

const auto any_reader = [](Value) { return true; };

// pre = add(matmul(x, W), b) or addmm(b, x, W) that a tanh GELU reads -> addmm_activation's pre.
Replacement gelu_pre(Rewriter& rw, const Candidate& c, const ActivationSites& sites) {
  if (c.old_number < 0 || !sites.gelu_pre(c.old_number)) return std::nullopt;
  // The candidate is not in the graph yet: its operands are.
  const std::optional<BiasedProduct> p =
      biased_product(rw.graph(), c.op(), c.inputs, c.attrs, c.outputs[0], any_reader);
  if (!p) return std::nullopt;
  const Values r = activation_op(rw, *p, "gelu_tanh", c.source);
  return Values{reshaped(rw, r[1], c.outputs[0].shape)};
}

// gelu(pre) {tanh}, pre addmm_activation's (through views) -> its out.
Replacement gelu_out(Rewriter& rw, const Candidate& c) {
  if (c.attrs.str("approximate") != "tanh") return std::nullopt;
  const Value pre = under_views(rw.graph(), c.inputs[0]);
  const Node& maker = rw.producer(pre);
  if (maker.op != "addmm_activation" || pre.output != 1) return std::nullopt;
  return Values{reshaped(rw, Value{pre.node, 0}, c.outputs[0].shape)};
}

// relu(pre), pre a biased product read by nothing else -> addmm_activation {relu}.
Replacement relu_out(Rewriter& rw, const Candidate& c, const ActivationSites& sites) {
  if (c.old_number < 0 || !sites.relu(c.old_number)) return std::nullopt;
  const std::optional<BiasedProduct> p = biased_product(rw.graph(), under_views(rw.graph(), c.inputs[0]), any_reader);
  if (!p) return std::nullopt;
  return Values{reshaped(rw, activation_op(rw, *p, "relu", c.source)[0], c.outputs[0].shape)};
}

// gelu_backward(matmul(g, V), pre) {tanh} -> mm_gelu_backward's grad_pre.
Replacement gelu_backward_in_product(Rewriter& rw, const Candidate& c, const ActivationSites& sites) {
  if (c.old_number < 0 || !sites.gelu_backward(c.old_number)) return std::nullopt;
  const Node& product = rw.producer(under_views(rw.graph(), c.inputs[0]));
  if (!is_product(product)) return std::nullopt;
  const Value g = product.inputs.at(0), v = product.inputs.at(1);
  const int64_t k = rw.type(v).shape[0], n = rw.type(v).shape[1];
  const int64_t m = numel_of(c.outputs[0].shape) / std::max<int64_t>(n, 1);
  const Values r = rw.add_op("mm_gelu_backward",
                             {reshaped(rw, g, Shape{m, k}), v, reshaped(rw, c.inputs[1], Shape{m, n})}, {}, c.source);
  return Values{reshaped(rw, r[0], c.outputs[0].shape)};
}

// sum(grad_pre, every dim but the last) of mm_gelu_backward's grad_pre -> its grad_bias.
Replacement gelu_bias_grad(Rewriter& rw, const Candidate& c) {
  if (c.inputs.size() != 1 || c.attrs.has("dtype")) return std::nullopt;
  const Value in = under_views(rw.graph(), c.inputs[0]);
  if (rw.producer(in).op != "mm_gelu_backward" || in.output != 0) return std::nullopt;
  const Shape& shape = rw.type(c.inputs[0]).shape;
  if (shape.empty()) return std::nullopt;
  std::vector<int64_t> dims = c.attrs.ints("dims");
  for (int64_t& d : dims)
    if (d < 0) d += static_cast<int64_t>(shape.size());
  std::sort(dims.begin(), dims.end());
  std::vector<int64_t> all_but_last(shape.size() - 1);
  std::iota(all_but_last.begin(), all_but_last.end(), 0);
  if (dims != all_but_last || shape.back() != rw.type(in).shape[1]) return std::nullopt;
  return Values{reshaped(rw, Value{in.node, 1}, c.outputs[0].shape)};
}

}  // namespace

const char* gemm_activations_name(GemmActivations where) {
  switch (where) {
    case GemmActivations::cuda: return "cuda";
    case GemmActivations::always: return "always";
    case GemmActivations::never: return "never";
  }
  return "?";
}

Graph gemm_activations(const Graph& graph, GemmActivations where, RewriteLog* log) {
  if (where == GemmActivations::never) return graph;
  const ActivationSites sites(graph, where);
  const std::vector<Rule> rules{
      {"gemm_gelu", {"add", "addmm"}, [&sites](Rewriter& rw, const Candidate& c) { return gelu_pre(rw, c, sites); }},
      {"gemm_gelu_out", {"gelu"}, [](Rewriter& rw, const Candidate& c) { return gelu_out(rw, c); }},
      {"gemm_relu", {"relu"}, [&sites](Rewriter& rw, const Candidate& c) { return relu_out(rw, c, sites); }},
      {"gemm_gelu_backward", {"gelu_backward"},
       [&sites](Rewriter& rw, const Candidate& c) { return gelu_backward_in_product(rw, c, sites); }},
      {"gemm_gelu_bias_grad", {"sum"}, [](Rewriter& rw, const Candidate& c) { return gelu_bias_grad(rw, c); }}};
  return rewrite(graph, rules, log);
}

}  // namespace kiln::compiler
