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
#include <array>
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

}  // namespace kiln::compiler
