// scaled_dot_product_attention in traced and compiled functions: one node of the graph
// (and one for its backward), an eager library step of the program, and compiled equals
// eager bit for bit, dropout included (the program gives the forward the seed and offset
// eager code draws, and the backward reads them from the forward's rng_state output); a
// TransformerEncoderLayer's training step (forward, backward, SGD) likewise.
#include <cstring>
#include <vector>

#include "compiler/compile.h"
#include "compiler_testing.h"
#include "core/ops/attention.h"
#include "models/attention.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::same_bits;
using namespace kiln::compiler;
using kiln::testing::count_ops;

namespace {

using Args = std::vector<Tensor>;

}  // namespace

TEST_CASE("attention: traced as one node with its backward, compiled equals eager",
          "[attention][compile]") {
  const double p = GENERATE(0.0, 0.25);
  for (const std::string backend : {"interpreter", "generated"}) {
    CAPTURE(p, backend);
    Generator gen(12);
    const Tensor mask = randn({1, 1, 37, 70}, {}, &gen);
    // q, k, v from one projection of x, as attention layers make them; the loss's gradient
    // goes through the backward op into the projection's weight.
    auto fn = [&](const Args& a) -> Args {
      Tensor w = a[1].detach();
      w.requires_grad_();
      const Tensor x = a[0];
      const Tensor q = matmul(x, w).unflatten(-1, {2, 8}).transpose(1, 2);  // [B, H, L, 8]
      const Tensor kv = a[2];
      const Tensor out = scaled_dot_product_attention(
          q, kv, kv, {.attn_mask = mask, .is_causal = true, .dropout_p = p});
      const Tensor loss = sum(mul(out, out));
      loss.backward();
      return {out, loss, w.grad()};
    };
    const Args args = {randn({2, 37, 16}, {}, &gen), randn({16, 16}, {}, &gen),
                       randn({2, 2, 70, 8}, {}, &gen)};
    CompiledFunction f = compile(fn, {.fullgraph = true, .backend = backend});
    for (uint64_t seed : {5u, 6u}) {
      manual_seed(seed);
      const Args got = f(args);
      const uint64_t end = default_generator().offset();
      manual_seed(seed);
      const Args want = fn(args);
      CHECK(default_generator().offset() == end);
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("output " << i << "\nactual:   " << testing::describe(got[i])
                       << "\nexpected: " << testing::describe(want[i]));
        CHECK(same_bits(got[i], want[i]));
      }
    }
    CHECK(f.recompiles() == 0);
    CHECK(f.graph_breaks() == 0);
    REQUIRE(f.traces().size() == 1);
    const Graph& g = f.traces()[0]->graph;
    CHECK(count_ops(g, "scaled_dot_product_attention") == 1);
    CHECK(count_ops(g, "scaled_dot_product_attention_backward") == 1);
    CHECK(count_ops(g, "softmax") == 0);
  }
}

TEST_CASE("attention: a TransformerEncoderLayer's training step compiles as eager",
          "[attention][equiv]") {
  const bool norm_first = GENERATE(false, true);
  CAPTURE(norm_first);
  auto make = [&] {
    manual_seed(21);
    return nn::TransformerEncoderLayer(16, 4,
                                       nn::TransformerEncoderLayerOptions{.dim_feedforward = 32,
                                                                          .dropout = 0.1,
                                                                          .activation = "gelu",
                                                                          .batch_first = true,
                                                                          .norm_first = norm_first});
  };
  Generator gen(22);
  const Tensor x = randn({3, 11, 16}, {}, &gen), y = randn({3, 11, 16}, {}, &gen);
  const Tensor padding = lt(rand({3, 11}, {}, &gen), 0.2);
  // Compiled and eager steps (forward, loss, backward, SGD) equal bit for bit, three calls.
  const CompiledFunction compiled = testing::check_step<nn::TransformerEncoderLayer>(
      make, [padding](nn::TransformerEncoderLayer& m, const Args& a) { return mse_loss(m.forward(a[0], {}, padding), a[1]); },
      {x, y});
  CHECK(count_ops(compiled.traces().at(0)->graph, "scaled_dot_product_attention") == 1);
}
