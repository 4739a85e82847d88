// The backward formula of scaled_dot_product_attention (autograd/formulas/nn.cpp), which
// calls the tiled backward op, against finite differences in f64 with gradcheck's
// defaults (eps 1e-6, atol 1e-5, rtol 1e-3).
#include "core/ops/attention.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("attention gradients: causal, masked, odd lengths and dropout",
          "[formulas-nn][attention]") {
  struct Case {
    int64_t L, S;
    bool causal;
    int mask;  // 0 none, 1 bool, 2 float broadcast over the batch
    double p;
  };
  // Lengths across the 64-key tiles of the kernel (67 keys: two tiles), L != S both ways.
  const Case c =
      GENERATE(Case{5, 67, false, 0, 0.0}, Case{70, 9, true, 0, 0.0}, Case{6, 67, false, 1, 0.0},
               Case{66, 66, true, 2, 0.0}, Case{7, 67, true, 0, 0.2});
  CAPTURE(c.L, c.S, c.causal, c.mask, c.p);
  Generator gen(4);
  Tensor mask;
  if (c.mask == 1) mask = lt(rand({c.L, c.S}, {}, &gen), 0.8);
  if (c.mask == 2) mask = randn({1, c.L, c.S}, {.dtype = DType::f64}, &gen);
  const std::vector<Tensor> inputs = {random_leaf({2, c.L, 4}, 1),
                                      random_transposed_leaf({2, c.S, 4}, 2),
                                      random_leaf({2, c.S, 3}, 3)};
  // Each call draws from a generator in the same state, so every evaluation drops the same
  // probabilities.
  auto fn = [&](const std::vector<Tensor>& x) {
    Generator drop(99);
    return scaled_dot_product_attention(
        x[0], x[1], x[2],
        {.attn_mask = mask, .is_causal = c.causal, .dropout_p = c.p, .generator = &drop});
  };
  CHECK(gradcheck(fn, inputs));
}

TEST_CASE("attention: only the gradients asked for are made", "[formulas-nn][attention]") {
  Tensor q = random_leaf({1, 3, 4}, 1);
  const Tensor k = randn({1, 5, 4}, {.dtype = DType::f64}),
               v = randn({1, 5, 2}, {.dtype = DType::f64});
  sum(scaled_dot_product_attention(q, k, v)).backward();
  CHECK(q.grad().defined());
  CHECK(q.grad().shape() == Shape{1, 3, 4});
  CHECK_FALSE(k.grad().defined());
}
