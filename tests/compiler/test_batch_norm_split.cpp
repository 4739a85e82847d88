// split_batch_norm (compiler/passes/batch_norm_split.cpp): a training batch norm becomes
// its statistics op plus a pointwise apply that fuses with the ReLU (and the residual add)
// after it, and its backward the sums op plus a pointwise input gradient into which ReLU's
// backward mask fuses. Checked here on the CPU, where the pass runs when asked
// (BatchNormSplit::always): the schedule's kernels, and compiled steps against eager ones.
//
// Tolerances: the statistics ops' CPU kernels are the eager kernels' own code (the same
// sums in the same order, rounded to the same factors), and the generated kernels apply
// those factors with the same operations in the same order (x * scale + shift; ((dy -
// mean_dy) - (x - mean) k) scale), in the compute type, with no contraction into FMAs (the
// C++ JIT compiles for baseline x86-64, which has none, and the eager loops run the same
// expressions). So the compiled step equals eager bit for bit; the checks allow 0.
#include <algorithm>
#include <string>

#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "compiler/trace.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::TempCache;
using Args = std::vector<Tensor>;

namespace {

struct Case {
  bool residual = false;
  DType dtype = DType::f32;
  bool channels_last = false;
};

std::string name_of(const Case& c) {
  return fmt::format("{}{} {}", c.residual ? "bn->add->relu" : "bn->relu", "",
                     kiln::name(c.dtype)) +
         (c.channels_last ? " channels_last" : " nchw");
}

// The leaves and buffers of one batch norm layer with a residual input, and its step:
// relu(batch_norm(x) [+ residual]), a weighted sum as the loss, backward.
struct Layer {
  Tensor x, residual, weight, bias, running_mean, running_var;

  Layer(const Case& c, uint64_t seed) {
    manual_seed(seed);
    const Shape shape{3, 5, 4, 3};
    const TensorOptions o{.dtype = c.dtype};
    auto layout = [&](Tensor t) {
      return c.channels_last ? t.contiguous(MemoryFormat::channels_last) : t;
    };
    x = layout(randn(shape, o) * 2.0 + 0.5).requires_grad_();
    residual = layout(randn(shape, o)).requires_grad_();
    weight = (rand({5}, o) + 0.5).requires_grad_();
    bias = randn({5}, o).requires_grad_();
    running_mean = randn({5}, o);
    running_var = rand({5}, o) + 0.5;
  }

  void clear_grads() const {
    for (const Tensor& t : {x, residual, weight, bias}) t.set_grad(Tensor());
  }

  Args step(const Args& a, bool residual_add) const {
    Tensor y = batch_norm(x, weight, bias, running_mean, running_var, true, 0.1, 1e-5);
    if (residual_add) y = y + residual;
    y = relu(y);
    Tensor loss = sum(y * a[0]);
    loss.backward();
    return {loss, y};
  }
};

void check_same(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.defined());
  REQUIRE(expected.defined());
  KILN_CHECK_CLOSE(actual, expected, 0.0, 0.0);
}

// The fused schedule of the step with the pass on.
std::vector<ScheduleStep> split_schedule(const Case& c, Graph& graph) {
  Layer layer(c, 1);
  const Args args = {randn({3, 5, 4, 3}, {.dtype = c.dtype})};
  const Trace t = trace([&](const Args& a) { return layer.step(a, c.residual); }, args);
  graph = run_pipeline(t.graph, default_compile_passes(LayoutPolicy::keep, BatchNormSplit::always),
                       nullptr, false);
  return fuse(graph);
}

bool has_op(const Graph& g, const ScheduleStep& step, const std::string& op) {
  return std::any_of(step.nodes.begin(), step.nodes.end(),
                     [&](int32_t n) { return g.nodes()[static_cast<size_t>(n)].op == op; });
}

}  // namespace

TEST_CASE("split_batch_norm: the apply fuses with relu and with the residual add and relu",
          "[batch_norm_split][passes]") {
  for (bool residual : {false, true}) {
    const Case c{.residual = residual};
    INFO(name_of(c));
    Graph g;
    const std::vector<ScheduleStep> steps = split_schedule(c, g);
    int stats = 0, sums = 0, apply = 0;
    for (const ScheduleStep& s : steps) {
      CHECK_FALSE(has_op(g, s, "batch_norm_update"));
      CHECK_FALSE(has_op(g, s, "batch_norm_backward"));
      stats += has_op(g, s, "batch_norm_train_stats");
      sums += has_op(g, s, "batch_norm_grad_stats");
      // x * scale + shift, the add, relu: one kernel, whose only store at the input's size
      // is relu's output (which ReLU's backward reads).
      if (s.kind == ScheduleStep::pointwise && has_op(g, s, "relu")) {
        ++apply;
        CHECK(has_op(g, s, "mul"));
        CHECK(has_op(g, s, "add"));
        CHECK(s.kernel.num_outputs() == 1);
      }
    }
    CHECK(stats == 1);
    CHECK(sums == 1);
    CHECK(apply == 1);
  }
}

// 16-bit: the apply and the input gradient read x in 16 bit and store only 16-bit values
// (the ops promote x as they read it; a cast node would be shared by the two kernels and
// stored in f32 between them, 3x the 16-bit traffic).
TEST_CASE("split_batch_norm: bf16 batch norm's kernels store nothing in f32",
          "[batch_norm_split][passes]") {
  for (bool residual : {false, true}) {
    const Case c{.residual = residual, .dtype = DType::bf16};
    INFO(name_of(c));
    Graph g;
    const std::vector<ScheduleStep> steps = split_schedule(c, g);
    int checked = 0;
    for (const ScheduleStep& s : steps) {
      if (s.kind != ScheduleStep::pointwise || !(has_op(g, s, "relu") || has_op(g, s, "sub")))
        continue;
      ++checked;
      for (int32_t b : s.kernel.output_buffers())
        CHECK(s.kernel.buffers[static_cast<size_t>(b)].dtype == DType::bf16);
      for (int32_t b : s.kernel.input_buffers()) {
        const codegen::Buffer& in = s.kernel.buffers[static_cast<size_t>(b)];
        if (g.type({in.node, in.output_index}).shape.size() == 4 && in.views.empty())
          CHECK(in.dtype == DType::bf16);
      }
    }
    CHECK(checked == 2);
  }
}

// In a ResNet's backward the gradient reaching a ReLU comes from a convolution's backward
// (a library step): where the mask has no other reader (after the stem's batch norm and bn1 of a
// basic block), the sums read the gradient and ReLU's output, and the mask is part of the input
// gradient's kernel, which stores only dx; where the residual's gradient reads it too (after the
// block's add), it is stored once and the sums read it.
TEST_CASE(
    "split_batch_norm: ReLU's backward mask fuses into batch norm's input gradient in ResNet-18",
    "[batch_norm_split][passes]") {
  manual_seed(0);
  models::ResNet model = models::resnet18({.num_classes = 10});
  model.train(true);
  const Graph g = kiln::testing::training_step_graph(model, randn({2, 3, 32, 32}),
                                                     randint(0, 10, {2}), BatchNormSplit::always);
  int masked_sums = 0, plain_sums = 0, fused_masks = 0, stored_masks = 0;
  for (const compiler::Node& n : g.nodes())
    if (n.kind == NodeKind::op && n.op == "batch_norm_grad_stats")
      (n.inputs[5].defined() ? masked_sums : plain_sums)++;
  for (const ScheduleStep& s : fuse(g)) {
    if (s.kind != ScheduleStep::pointwise || !has_op(g, s, "where")) continue;
    if (has_op(g, s, "sub") && s.kernel.num_outputs() == 1)
      ++fused_masks;
    else
      ++stored_masks;
  }
  CHECK(masked_sums ==
        9);  // the stem's (its gradient from max pooling's) and bn1 of the eight blocks
  CHECK(plain_sums == 20 - 9);
  CHECK(fused_masks == masked_sums);
  CHECK(stored_masks == 8);  // the eight blocks' add and relu
}

TEST_CASE("split_batch_norm: the sums read ReLU's output only when the mask has no other reader",
          "[batch_norm_split][passes]") {
  for (bool residual : {false, true}) {
    Graph g;
    split_schedule(Case{.residual = residual}, g);
    for (const compiler::Node& n : g.nodes())
      if (n.kind == NodeKind::op && n.op == "batch_norm_grad_stats") {
        INFO((residual ? "residual" : "plain"));
        // With the residual add the masked gradient is also the residual's gradient: the
        // sums read it as it is (no ReLU output), so it is computed once.
        CHECK(n.inputs[5].defined() == !residual);
      }
  }
}

TEST_CASE("split_batch_norm: compiled steps equal eager ones (f32, f64, NCHW, channels_last)",
          "[batch_norm_split][compile]") {
  TempCache cache;
  for (DType dtype : {DType::f32, DType::f64})
    for (bool channels_last : {false, true})
      for (bool residual : {false, true}) {
        const Case c{.residual = residual, .dtype = dtype, .channels_last = channels_last};
        INFO(name_of(c));
        const Layer eager(c, 7), compiled(c, 7);
        CompiledFunction f =
            compile([&](const Args& a) { return compiled.step(a, c.residual); },
                    {.fullgraph = true, .batch_norm_split = BatchNormSplit::always});
        for (int call = 0; call < 3; ++call) {
          INFO("call " << call);
          const Args a = {randn({3, 5, 4, 3}, {.dtype = dtype})};
          eager.clear_grads();
          compiled.clear_grads();
          const Args want = eager.step(a, c.residual);
          const Args got = f(a);
          // The loss is a generated reduction, which sums in another order than the eager
          // kernel (both in f64): 180 terms, so up to 180 f64 roundings of the sum of their
          // magnitudes (at most 1e3 here) apart; f32 results round that away.
          KILN_CHECK_CLOSE(got[0], want[0], 0.0, dtype == DType::f64 ? 180 * 1e3 * 0x1p-53 : 0.0);
          check_same(got[1], want[1]);
          check_same(compiled.x.grad(), eager.x.grad());
          check_same(compiled.weight.grad(), eager.weight.grad());
          check_same(compiled.bias.grad(), eager.bias.grad());
          if (residual) check_same(compiled.residual.grad(), eager.residual.grad());
          check_same(compiled.running_mean, eager.running_mean);
          check_same(compiled.running_var, eager.running_var);
        }
        CHECK(f.cache_size() == 1);
      }
}

TEST_CASE("split_batch_norm: compiled ResNet-18 and ResNet-50 steps equal eager with the split",
          "[batch_norm_split][compile]") {
  TempCache cache;
  for (const char* arch : {"resnet18", "resnet50"}) {
    INFO(arch);
    manual_seed(3);
    auto make = [&] {
      return std::string(arch) == "resnet18" ? models::resnet18({.num_classes = 10})
                                             : models::resnet50({.num_classes = 10});
    };
    models::ResNet eager = make();
    models::ResNet compiled = make();
    compiled.load_state_dict(eager.state_dict());
    eager.train();
    compiled.train();
    auto step = [](nn::Module& m, const Args& a) -> Args {
      m.zero_grad();
      Tensor loss = cross_entropy(m.forward(a[0]), a[1]);
      loss.backward();
      return {loss};
    };
    CompiledFunction f = compile([&](const Args& a) { return step(compiled, a); },
                                 {.fullgraph = true, .batch_norm_split = BatchNormSplit::always});
    for (int call = 0; call < 2; ++call) {
      const Args a = {randn({2, 3, 32, 32}), randint(0, 10, {2})};
      const Args want = step(eager, a);
      const Args got = f(a);
      KILN_CHECK_CLOSE(got[0], want[0], 0.0, 0.0);
      const auto p = compiled.named_parameters(), q = eager.named_parameters();
      for (size_t i = 0; i < p.size(); ++i) {
        INFO(p[i].first);
        check_same(p[i].second.grad(), q[i].second.grad());
      }
      const auto b = compiled.named_buffers(), e = eager.named_buffers();
      for (size_t i = 0; i < b.size(); ++i) {
        INFO(b[i].first);
        check_same(b[i].second, e[i].second);
      }
    }
  }
}

TEST_CASE("split_batch_norm: the statistics ops name themselves and the shapes on bad input",
          "[batch_norm_split][errors]") {
  const Tensor x = randn({2, 3, 4}), c3 = ones({3}), c4 = ones({4});
  CHECK_THROWS_WITH(
      call_op(find_op("batch_norm_train_stats"), {x, c4, Tensor(), c3, c3},
              {{"momentum", 0.1}, {"eps", 1e-5}}),
      Catch::Matchers::Contains("batch_norm_train_stats") && Catch::Matchers::Contains("[4]"));
  CHECK_THROWS_WITH(
      call_op(find_op("batch_norm_grad_stats"), {randn({2, 3, 5}), x, Tensor(), c3, c3, Tensor()},
              {}),
      Catch::Matchers::Contains("batch_norm_grad_stats") && Catch::Matchers::Contains("[2,3,5]"));
  CHECK_THROWS_WITH(call_op(find_op("batch_norm_train_stats"), {randn({1, 3}), c3, c3, c3, c3},
                            {{"momentum", 0.1}, {"eps", 1e-5}}),
                    Catch::Matchers::Contains("more than 1 value per channel"));
}
