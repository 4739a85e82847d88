// gemm_activations (compiler/passes/epilogue.cpp): a Linear's tanh GELU or ReLU, and the tanh
// GELU's backward with its bias gradient, become addmm_activation and mm_gelu_backward, the
// ops cuBLASLt's epilogues run on CUDA. The pass applies to CUDA values by default; these
// tests ask for it on the CPU (GemmActivations::always), where the ops are their chains of
// ops, and check that the rewrite happens where it should and nowhere else, and that the
// compiled step then equals eager to rounding. Compared in f64 (rounding 2^-53 per operation):
// addmm adds the bias before the product's sums where eager adds it after, which moves each
// value by a few ulps, amplified through the backward of these small models to far below
// 1e-10 relative; a wrong operand, a missing bias or a transposed gradient moves results by
// O(1).
#include <functional>
#include <memory>
#include <vector>

#include "compiler/compile.h"
#include "compiler/passes/passes.h"
#include "compiler_testing.h"
#include "core/autocast.h"
#include "models/gpt2.h"
#include "transformer_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;
using kiln::testing::count_ops;

namespace {

using Args = std::vector<Tensor>;
constexpr double kRtol = 1e-10;

Graph optimized(const CompiledFunction& f, GemmActivations where) {
  return run_pipeline(f.traces().at(0)->graph,
                      default_compile_passes(LayoutPolicy::automatic, BatchNormSplit::cuda, true, where), nullptr,
                      false);
}

// compare_steps on f64 models with the pass on the CPU, every output and parameter within
// kRtol (transformer_testing.h).
template <class Model>
CompiledFunction check_step_close(const std::function<Model()>& make,
                                  const std::function<Args(Model&, const Args&)>& outputs_of, const Args& args) {
  return testing::check_step_close(make, outputs_of, args, kRtol, {.gemm_activations = GemmActivations::always});
}

}  // namespace

TEST_CASE("gemm_activations: a GPT-2 step runs each MLP's GELU and its backward in the products",
          "[gemm_activations][gpt2]") {
  models::GPT2Config c = testing::small_gpt2();
  c.n_layer = 2;
  Generator gen(61);
  const Tensor ids = randint(0, 60, {3, 13}, {}, &gen);
  const std::function<models::GPT2LMHeadModel()> make = testing::make_gpt2(c, 62);
  std::function<Args(models::GPT2LMHeadModel&, const Args&)> step = [](models::GPT2LMHeadModel& m, const Args& a) {
    return Args{models::causal_lm_loss(m.forward(a[0]), a[0])};
  };
  CompiledFunction f = check_step_close(make, step, {ids});
  const Graph g = optimized(f, GemmActivations::always);
  CHECK(count_ops(g, "addmm_activation") == c.n_layer);
  CHECK(count_ops(g, "mm_gelu_backward") == c.n_layer);
  CHECK(count_ops(g, "gelu") == 0);
  CHECK(count_ops(g, "gelu_backward") == 0);
  // Each layer's c_fc bias gradient is the op's second output, not a sum of its own.
  const int64_t sums = count_ops(g, "sum");
  CHECK(count_ops(optimized(f, GemmActivations::never), "sum") == sums + c.n_layer);
  // By default only CUDA values are rewritten.
  CHECK(count_ops(optimized(f, GemmActivations::cuda), "addmm_activation") == 0);
  CHECK(count_ops(optimized(f, GemmActivations::cuda), "gelu") == c.n_layer);
}

TEST_CASE("gemm_activations: under autocast the addmm of a Conv1D takes the GELU too", "[gemm_activations][autocast]") {
  // bf16 results cannot be compared to 1e-10, so this checks the graph and that the compiled
  // step runs and agrees with eager to bf16's rounding of the activations (2^-8 relative per
  // rounding; 5e-2 of the loss is far above the handful of roundings a loss sums and far below
  // a wrong result).
  models::GPT2Config c = models::GPT2Config::tiny(/*vocab_size=*/40);
  c.n_embd = 16;
  c.n_head = 2;
  c.n_layer = 1;
  c.n_positions = 8;
  Generator gen(63);
  const Tensor ids = randint(0, 40, {2, 8}, {}, &gen);
  manual_seed(64);
  auto model = std::make_shared<models::GPT2LMHeadModel>(c);
  model->train(false);  // no dropout: the two runs draw nothing
  const TracedFunction step = [model](const Args& a) {
    Tensor loss;
    {
      autocast amp({.device_type = DeviceType::cpu, .dtype = DType::bf16});
      loss = models::causal_lm_loss(model->forward(a[0]), a[0]);
    }
    loss.backward();
    Args out{loss.detach()};
    for (const Tensor& p : model->parameters()) out.push_back(p.grad().detach().clone());
    model->zero_grad();
    return out;
  };
  CompiledFunction f = compile(step, {.fullgraph = true, .gemm_activations = GemmActivations::always});
  const Args got = f({ids});
  const Args want = step({ids});
  CHECK(testing::allclose(got[0], want[0], 5e-2, 0));
  const Graph g = optimized(f, GemmActivations::always);
  CHECK(count_ops(g, "addmm_activation") == 1);
  CHECK(count_ops(g, "mm_gelu_backward") == 1);
  CHECK(count_ops(g, "gelu") == 0);
}

TEST_CASE("gemm_activations: a Linear's ReLU joins the product when nothing else reads the product",
          "[gemm_activations]") {
  std::function<nn::Sequential()> make = [] {
    manual_seed(65);
    return nn::Sequential(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 8), nn::GELU("tanh"), nn::Linear(8, 3));
  };
  Generator gen(66);
  const Tensor x = randn({5, 12}, {}, &gen).to(DType::f64);
  SECTION("the MLP: one ReLU and one GELU in their products") {
    std::function<Args(nn::Sequential&, const Args&)> step = [](nn::Sequential& m, const Args& a) {
      const Tensor y = m.forward(a[0]);
      return Args{sum(mul(y, y))};
    };
    CompiledFunction f = check_step_close(make, step, {x});
    const Graph g = optimized(f, GemmActivations::always);
    CHECK(count_ops(g, "addmm_activation") == 2);
    CHECK(count_ops(g, "relu") == 0);
    // The GELU's gradient comes from the last Linear's input-gradient product.
    CHECK(count_ops(g, "mm_gelu_backward") == 1);
  }
  SECTION("rows that are a permuted view are not reshaped: the chain stays") {
    const Tensor x3 = randn({3, 5, 12}, {}, &gen).to(DType::f64);
    std::function<Args(nn::Sequential&, const Args&)> step = [](nn::Sequential& m, const Args& a) {
      auto& first = m[0];
      const Tensor y = gelu(first.forward(a[0].transpose(0, 1)), "tanh");
      return Args{sum(mul(y, y))};
    };
    CompiledFunction f = check_step_close(make, step, {x3});
    const Graph g = optimized(f, GemmActivations::always);
    CHECK(count_ops(g, "addmm_activation") == 0);
    CHECK(count_ops(g, "gelu") == 1);
  }
  SECTION("the product before the ReLU is an output: both stay") {
    std::function<Args(nn::Sequential&, const Args&)> step = [](nn::Sequential& m, const Args& a) {
      auto& first = m[0];
      const Tensor pre = first.forward(a[0]);
      const Tensor y = relu(pre);
      return Args{sum(mul(y, y)), pre.detach()};
    };
    CompiledFunction f = check_step_close(make, step, {x});
    const Graph g = optimized(f, GemmActivations::always);
    CHECK(count_ops(g, "addmm_activation") == 0);
    CHECK(count_ops(g, "relu") == 1);
  }
}

TEST_CASE("addmm_activation and mm_gelu_backward equal their chains of ops", "[gemm_activations][ops]") {
  Generator gen(67);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(name(dt));
    const Tensor a = randn({7, 5}, {}, &gen).to(dt), b = randn({5, 9}, {}, &gen).to(dt), bias = randn({9}, {}, &gen).to(dt);
    const AddmmActivation g = addmm_activation(bias, a, b, "gelu_tanh");
    const Tensor pre = addmm(bias, a, b);
    CHECK(testing::allclose(g.pre, pre, 0, 0));
    CHECK(testing::allclose(g.out, gelu(pre, "tanh"), 0, 0));
    const AddmmActivation r = addmm_activation(bias, a, b, "relu");
    CHECK_FALSE(r.pre.defined());
    CHECK(testing::allclose(r.out, relu(pre), 0, 0));
    const Tensor grad = randn({7, 4}, {}, &gen).to(dt), w = randn({4, 9}, {}, &gen).to(dt);
    const MmGeluBackward back = mm_gelu_backward(grad, w, pre);
    const Tensor want = gelu_backward(mm(grad, w), pre, "tanh");
    CHECK(testing::allclose(back.grad_pre, want, 0, 0));
    CHECK(testing::allclose(back.grad_bias, sum(want, {0}), 0, 0));
  }
  const Tensor a = randn({4, 3}), b = randn({3, 6}), bias = randn({6});
  CHECK_THROWS_WITH(addmm_activation(bias, a, b, "tanh"), Contains("activation must be"));
  CHECK_THROWS_WITH(addmm_activation(randn({5}), a, b, "relu"),
                    Contains("addmm_activation: bias must be [6]"));
  CHECK_THROWS_WITH(addmm_activation(bias, a, randn({4, 6}), "relu"),
                    Contains("inner sizes 3 and 4 differ"));
  CHECK_THROWS_WITH(mm_gelu_backward(a, b, randn({4, 5})),
                    Contains("mm_gelu_backward: pre must be the product's shape [4,6]"));
  CHECK_THROWS_WITH(mm_gelu_backward(a, b.to(DType::f64), randn({4, 6})),
                    Contains("dtypes f32 and f64 differ"));
}
