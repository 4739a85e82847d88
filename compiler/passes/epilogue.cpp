// gemm_epilogues: additions a GEMM can do itself (compiler/passes/passes.h). A GEMM computes
// C = alpha * A @ B + beta * C, so x + mm(a, b), where x has the product's own shape and
// type, is addmm(x, a, b): the product lands on x's values without a second pass, and with
// no temporary the product's size. That is `grad += g` of gradient accumulation (a Linear
// weight's gradient is one mm) and a full-size residual add; where the sum is written back
// into x, the program runs addmm in place (Program's in-place write-backs).
//
// The rule reads the old graph to know that the product has no other reader (it would be
// computed twice otherwise). Sums round differently: a GEMM adds x before or between its
// blocks over k instead of once at the end, so the result agrees to rounding, not bit for
// bit.
#include <array>
#include <unordered_map>

#include "compiler/passes/passes.h"

namespace kiln::compiler {

namespace {

bool is_product(const Rewriter& rw, Value v) { return rw.is_op(v, "matmul") || rw.is_op(v, "mm"); }

// The facts about the old graph the rule needs: per value number of an add node, whether
// each operand is a product that nothing else reads (not another node, an output or a
// write-back).
class SoleProducts {
 public:
  explicit SoleProducts(const Graph& g) {
    // Readers among the live nodes only: the passes before leave the nodes they bypassed
    // (a transposed gradient's permutes) for dead_code, and those read nothing at run time.
    std::vector<bool> live(g.nodes().size(), false);
    for (Value v : g.outputs()) live[static_cast<size_t>(v.node)] = true;
    for (const auto& wb : g.write_backs()) live[static_cast<size_t>(wb.second.node)] = true;
    for (size_t n = g.nodes().size(); n-- > 0;)
      if (live[n])
        for (Value v : g.nodes()[n].inputs)
          if (v.defined()) live[static_cast<size_t>(v.node)] = true;
    std::vector<std::vector<int32_t>> readers(g.nodes().size());
    auto read = [&](Value v) {
      if (v.defined()) readers[static_cast<size_t>(v.node)].push_back(v.output);
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
        sole[i] = maker.kind == NodeKind::op && (maker.op == "matmul" || maker.op == "mm") &&
                  readers[static_cast<size_t>(v.node)].size() == 1;
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

// x + mm(a, b) or mm(a, b) + x -> addmm(x, a, b), for 2-d f32 or f64 operands where x has
// the sum's type (no broadcast, no promotion) and the add scales by 1.
Replacement accumulate_into_gemm(Rewriter& rw, const Candidate& c, const SoleProducts& sole) {
  if (c.old_number < 0 || c.inputs.size() != 2) return std::nullopt;
  if (const std::optional<Scalar> alpha = c.attrs.optional_scalar("alpha"); alpha && alpha->to_double() != 1.0)
    return std::nullopt;
  const TensorType& sum = c.outputs.at(0);
  if (sum.dtype != DType::f32 && sum.dtype != DType::f64) return std::nullopt;
  for (size_t i = 0; i < 2; ++i) {
    const Value product = c.inputs[i], x = c.inputs[1 - i];
    if (!is_product(rw, product) || !sole.operand_is_sole_product(c, i)) continue;
    const Node& mm = rw.producer(product);
    const Value a = mm.inputs.at(0), b = mm.inputs.at(1);
    if (rw.type(a).shape.size() != 2 || rw.type(b).shape.size() != 2 || rw.type(x) != sum) continue;
    return Values{rw.add_op1("addmm", {x, a, b}, {}, c.source)};
  }
  return std::nullopt;
}

}  // namespace

Graph gemm_epilogues(const Graph& graph, RewriteLog* log) {
  const SoleProducts sole(graph);
  const std::vector<Rule> rules{
      {"accumulate_into_gemm", {"add"}, [&sole](Rewriter& rw, const Candidate& c) { return accumulate_into_gemm(rw, c, sole); }}};
  return rewrite(graph, rules, log);
}

}  // namespace kiln::compiler
