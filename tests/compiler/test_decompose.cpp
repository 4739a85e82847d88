// The decompose rules (compiler/passes/passes.h): layer_norm and layer_norm_backward rewritten
// into reductions and elementwise ops equal the eager kernels, and the MLP block
// y = x + fc2(gelu(fc1(layer_norm(x)))) built with them runs in fewer eager steps with the
// same gradients. The pass applies them on CUDA only: on the CPU it keeps the eager kernels,
// and a compiled CPU step still equals eager. The arithmetic is checked here on the CPU.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "compiler/compile.h"
#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "compiler/program.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;

namespace {

using kiln::testing::TempCache;

using Args = std::vector<Tensor>;

int64_t eager_steps(const Graph& g) {
  int64_t n = 0;
  for (const ScheduleStep& group : fuse(g)) n += group.kind == ScheduleStep::eager;
  return n;
}

Tensor leaf(Tensor t) {
  t.requires_grad_(true);
  return t;
}

// The traced graph of a layer norm's forward (out, mean, rstd) and backward (the grads of
// x, w and b as grad effects), before and after decompose.
struct LayerNormCase {
  Trace traced;
  Graph decomposed;
  Args inputs;
  RewriteLog log;
};

LayerNormCase layer_norm_case(DType dtype, const Shape& shape, const std::vector<int64_t>& normalized, bool affine) {
  const TensorOptions o{.dtype = dtype};
  Tensor x = leaf(randn(shape, o) * 3 + 1);
  Tensor w = affine ? leaf(randn(normalized, o)) : Tensor();
  Tensor b = affine ? leaf(randn(normalized, o)) : Tensor();
  const Tensor gy = randn(shape, o);
  auto fn = [&](const Args& a) -> Args {
    const LayerNormResult r = layer_norm_with_stats(a[0], normalized, w, b, 1e-5);
    sum(r.output * a[1]).backward();
    NoGradGuard no_grad;
    return {r.output.detach(), r.mean.detach(), r.rstd.detach()};
  };
  LayerNormCase c{.traced = trace(fn, {x, gy})};
  c.decomposed = rewrite(c.traced.graph, decompose_rules(), &c.log);
  verify(c.decomposed);
  c.inputs = c.traced.inputs_for({x, gy});
  return c;
}

void check_equal_to_eager(const LayerNormCase& c, double tol) {
  const Args eager = interpret(c.traced.graph, c.inputs);
  const Args decomposed = interpret(c.decomposed, c.inputs);
  REQUIRE(eager.size() == decomposed.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("output " << i);
    CHECK(decomposed[i].dtype() == eager[i].dtype());
    KILN_CHECK_CLOSE(decomposed[i], eager[i], tol, tol);
  }
}

struct MlpBlock {
  Tensor ln_w, ln_b, w1, b1, w2, b2;
  MlpBlock(int64_t width, int64_t hidden, DType dtype) {
    const TensorOptions o{.dtype = dtype};
    ln_w = leaf(randn({width}, o));
    ln_b = leaf(randn({width}, o));
    w1 = leaf(randn({hidden, width}, o) * 0.3);
    b1 = leaf(randn({hidden}, o));
    w2 = leaf(randn({width, hidden}, o) * 0.3);
    b2 = leaf(randn({width}, o));
  }
  Args params() const { return {ln_w, ln_b, w1, b1, w2, b2}; }
  Args step(const Args& a) const {
    const Tensor h = layer_norm(a[0], {a[0].size(-1)}, ln_w, ln_b, 1e-5);
    const Tensor y = a[0] + (matmul(gelu(matmul(h, w1.t()) + b1), w2.t()) + b2);
    Tensor loss = mean(y * y);
    loss.backward();
    return {loss.detach()};
  }
  void clear_grads() const {
    for (const Tensor& p : params()) p.set_grad(Tensor());
  }
};

}  // namespace

TEST_CASE("decompose rewrites layer norm forward and backward equal to eager in f32 and f64", "[decompose]") {
  manual_seed(31);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool affine : {true, false}) {
      INFO(fmt::format("{} affine={}", dtype, affine));
      const LayerNormCase c = layer_norm_case(dtype, {6, 33}, {33}, affine);
      CHECK(count_ops(c.decomposed, "layer_norm") == 0);
      CHECK(count_ops(c.decomposed, "layer_norm_backward") == 0);
      REQUIRE(c.log.size() == 2);
      CHECK(c.log[0].starts_with("decompose_layer_norm: layer_norm("));
      CHECK(c.log[1].starts_with("decompose_layer_norm_backward: layer_norm_backward("));
      check_equal_to_eager(c, dtype == DType::f32 ? 1e-5 : 1e-10);
    }
  }
}

TEST_CASE("decompose normalizes over several trailing dims of a 3-d input", "[decompose]") {
  manual_seed(32);
  const LayerNormCase f32_case = layer_norm_case(DType::f32, {3, 4, 5, 6}, {5, 6}, true);
  CHECK(count_ops(f32_case.decomposed, "layer_norm") == 0);
  check_equal_to_eager(f32_case, 1e-5);
  const LayerNormCase f64_case = layer_norm_case(DType::f64, {2, 7, 9}, {7, 9}, true);
  check_equal_to_eager(f64_case, 1e-10);
}

TEST_CASE("decompose leaves ops it has no rule for and keeps the graph otherwise", "[decompose]") {
  Graph g;
  const Value x = g.add_input("x", TensorType{.dtype = DType::f32, .shape = {4, 8}});
  const Value y = g.add_op1("softmax", {x}, {{"dim", int64_t{1}}});
  g.set_outputs({y});
  RewriteLog log;
  const Graph out = rewrite(g, decompose_rules(), &log);
  CHECK(log.empty());
  CHECK(print(out) == print(g));
}

TEST_CASE("the decompose pass keeps layer norm's eager kernels on the CPU", "[decompose]") {
  manual_seed(34);
  const LayerNormCase c = layer_norm_case(DType::f32, {6, 33}, {33}, true);
  REQUIRE(c.log.size() == 2);  // the rules apply on the CPU
  RewriteLog log;
  const Graph out = decompose(c.traced.graph, &log);
  CHECK(log.empty());
  CHECK(print(out) == print(c.traced.graph));
}

// The passes kiln::compile runs, with the decompose rules applied on every device.
std::vector<NamedPass> passes_decomposing_everywhere() {
  std::vector<NamedPass> passes = default_compile_passes();
  for (NamedPass& p : passes)
    if (p.name == "decompose") p.run = [](const Graph& g, RewriteLog* log) { return rewrite(g, decompose_rules(), log); };
  return passes;
}

TEST_CASE("decompose lets the MLP block step fuse into fewer eager steps with equal loss and grads", "[decompose]") {
  TempCache cache;
  manual_seed(33);
  const MlpBlock block(16, 32, DType::f32);
  const Tensor x = randn({8, 16});
  auto fn = [&block](const Args& a) { return block.step(a); };

  // The graph compile builds on the CPU (layer norm kept) and the one with the rules.
  block.clear_grads();
  const Trace t = trace(fn, {x});
  const Graph kept = run_pipeline(t.graph, default_compile_passes(), nullptr, false);
  const Graph with = run_pipeline(t.graph, passes_decomposing_everywhere(), nullptr, false);
  CHECK(count_ops(kept, "layer_norm") == 1);
  CHECK(count_ops(kept, "layer_norm_backward") == 1);
  CHECK(count_ops(with, "layer_norm") + count_ops(with, "layer_norm_backward") == 0);
  // Only the matmuls stay eager (two forward, four backward); layer norm's dx, which no one
  // reads (x needs no grad), is gone.
  CHECK(eager_steps(with) == 6);
  CHECK(eager_steps(with) < eager_steps(kept));

  // The decomposed program's loss and gradient effects against the eager step's. Tolerance:
  // 1e-5 relative and absolute, f32 results of sums over at most 32 terms reordered.
  block.clear_grads();
  const Tensor eager_loss = block.step({x})[0];
  Args eager_grads;
  for (const Tensor& p : block.params()) eager_grads.push_back(p.grad());
  block.clear_grads();
  const Args inputs = t.inputs_for({x});
  const Args decomposed = Program(with).run(inputs);
  const Args reference = interpret(t.graph, inputs);
  REQUIRE(decomposed.size() == reference.size());
  KILN_CHECK_CLOSE(decomposed[0], eager_loss, 1e-5, 1e-5);
  for (size_t i = 0; i < decomposed.size(); ++i) {
    INFO("output " << i);
    KILN_CHECK_CLOSE(decomposed[i], reference[i], 1e-5, 1e-5);
  }

  // kiln::compile on the CPU (layer norm's eager kernels) against eager.
  CompiledFunction compiled = compile(fn);
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call);
    block.clear_grads();
    const Tensor loss = compiled({x})[0];
    Args grads;
    for (const Tensor& p : block.params()) grads.push_back(p.grad());
    KILN_CHECK_CLOSE(loss, eager_loss, 1e-5, 1e-5);
    for (size_t i = 0; i < grads.size(); ++i) {
      INFO("param " << i);
      REQUIRE(grads[i].defined());
      KILN_CHECK_CLOSE(grads[i], eager_grads[i], 1e-5, 1e-5);
    }
  }
  CHECK(compiled.recompiles() == 0);
}
