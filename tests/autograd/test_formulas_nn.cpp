// Backward formulas of the neural-network ops (autograd/formulas/nn.cpp), checked against
// finite differences in f64 with gradcheck's defaults (eps 1e-6, atol 1e-5, rtol 1e-3).
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A random f64 leaf that requires grad (normal, or uniform in [lo, hi) when lo < hi).
Tensor leaf(Shape shape, uint64_t seed, double lo = 0, double hi = 0) {
  Generator gen(seed);
  Tensor t = lo < hi ? rand(std::move(shape), {.dtype = DType::f64}, &gen) * (hi - lo) + lo
                     : randn(std::move(shape), {.dtype = DType::f64}, &gen);
  t = t.detach();
  t.requires_grad_();
  return t;
}

Tensor index_target(std::vector<int64_t> v, Shape shape) {
  return from_vector<int64_t>(v, std::move(shape));
}

using Inputs = std::vector<Tensor>;

}  // namespace

TEST_CASE("conv2d gradients with stride padding dilation groups and bias", "[formulas-nn]") {
  struct Case {
    Shape input, weight;
    Conv2dOptions options;
    bool bias;
  };
  const Case cases[] = {
      {{1, 2, 4, 4}, {3, 2, 3, 3}, {}, false},
      {{2, 2, 5, 5}, {3, 2, 2, 3}, {.stride = {2, 1}, .padding = {1, 0}}, true},
      {{2, 4, 6, 5},
       {4, 2, 2, 2},
       {.stride = {1, 2}, .padding = {1, 1}, .dilation = {2, 1}, .groups = 2},
       true},
      {{1, 6, 5, 5},
       {3, 2, 3, 3},
       {.stride = {2, 2}, .padding = {2, 1}, .dilation = {1, 2}, .groups = 3},
       true},
  };
  uint64_t seed = 1;
  for (const Case& k : cases) {
    Tensor x = leaf(k.input, seed++), w = leaf(k.weight, seed++);
    Tensor b = k.bias ? leaf({k.weight[0]}, seed++) : Tensor();
    const Conv2dOptions options = k.options;
    CHECK(gradcheck([&](const Inputs& in) { return conv2d(in[0], in[1], in[2], options); },
                    {x, w, b}));
  }
}

TEST_CASE("conv2d gradient of only the weight leaves the input alone", "[formulas-nn]") {
  Tensor x = randn({1, 2, 4, 4}, {.dtype = DType::f64});
  Tensor w = leaf({2, 2, 3, 3}, 7);
  CHECK(gradcheck(
      [](const Inputs& in) {
        return conv2d(in[0], in[1], {}, {.padding = {1, 1}});
      },
      {x, w}));
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("max_pool2d gradients with padding dilation and ceil_mode", "[formulas-nn]") {
  Tensor x = leaf({2, 2, 5, 6}, 11);
  CHECK(gradcheck([](const Inputs& in) { return max_pool2d(in[0], {2}); }, {x}));
  CHECK(gradcheck([](const Inputs& in) { return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}); }, {x}));
  CHECK(
      gradcheck([](const Inputs& in) { return max_pool2d(in[0], {2}, {2}, {1}, {1}, true); }, {x}));
  CHECK(gradcheck(
      [](const Inputs& in) {
        return max_pool2d(in[0], {2, 2}, {1}, {0}, {2, 1});
      },
      {x}));
  Tensor x3 = leaf({3, 5, 5}, 12);  // unbatched
  CHECK(gradcheck([](const Inputs& in) { return max_pool2d(in[0], {3}, {2}, {1}, {1}, true); },
                  {x3}));
}

TEST_CASE("max_pool2d indices carry no gradient and overlapping windows accumulate",
          "[formulas-nn]") {
  // A single large value is the maximum of all four overlapping 2x2 windows around it.
  Tensor x = tensor_of({0, 0, 0, 0, 9, 0, 0, 0, 0}, {1, 1, 3, 3}, DType::f64);
  x.requires_grad_();
  MaxPool2dResult r = max_pool2d_with_indices(x, {2}, {1});
  CHECK(r.values.requires_grad());
  CHECK_FALSE(r.indices.requires_grad());
  r.values.backward(ones({1, 1, 2, 2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({0, 0, 0, 0, 4, 0, 0, 0, 0}, {1, 1, 3, 3}, DType::f64));
}

TEST_CASE("avg_pool2d gradients with padding ceil_mode count_include_pad and divisor",
          "[formulas-nn]") {
  Tensor x = leaf({2, 2, 5, 6}, 21);
  CHECK(gradcheck([](const Inputs& in) { return avg_pool2d(in[0], {2}); }, {x}));
  CHECK(gradcheck([](const Inputs& in) { return avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}); }, {x}));
  CHECK(gradcheck([](const Inputs& in) { return avg_pool2d(in[0], {3}, {2}, {1}, true, false); },
                  {x}));
  CHECK(gradcheck([](const Inputs& in) { return avg_pool2d(in[0], {2}, {2}, {1}, true, true, 3); },
                  {x}));
  Tensor x3 = leaf({2, 5, 4}, 22);
  CHECK(gradcheck([](const Inputs& in) { return avg_pool2d(in[0], {2}, {1}); }, {x3}));
}

TEST_CASE("adaptive_avg_pool2d gradients with uneven windows", "[formulas-nn]") {
  Tensor x = leaf({2, 2, 5, 7}, 31);
  CHECK(gradcheck([](const Inputs& in) { return adaptive_avg_pool2d(in[0], {3, 4}); }, {x}));
  CHECK(gradcheck([](const Inputs& in) { return adaptive_avg_pool2d(in[0], {1}); }, {x}));
  Tensor x3 = leaf({2, 4, 3}, 32);
  CHECK(gradcheck([](const Inputs& in) { return adaptive_avg_pool2d(in[0], {6, 2}); }, {x3}));
}

TEST_CASE("batch_norm gradients in training and eval with and without affine", "[formulas-nn]") {
  for (bool training : {true, false}) {
    for (bool affine : {true, false}) {
      for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 2, 3}}) {
        CAPTURE(training, affine, shape_str(shape));
        Tensor x = leaf(shape, 41);
        Tensor w = affine ? leaf({3}, 42) : Tensor(), b = affine ? leaf({3}, 43) : Tensor();
        Tensor running_mean = tensor_of({0.5, -1, 2}, {3}, DType::f64);
        Tensor running_var = tensor_of({1.5, 0.25, 3}, {3}, DType::f64);
        CHECK(gradcheck(
            [&](const Inputs& in) {
              return batch_norm(in[0], in[1], in[2], running_mean, running_var, training, 0.1,
                                1e-5);
            },
            {x, w, b}));
      }
    }
  }
}

TEST_CASE("batch_norm without running statistics in training", "[formulas-nn]") {
  Tensor x = leaf({3, 2, 2, 2}, 44), w = leaf({2}, 45), b = leaf({2}, 46);
  CHECK(gradcheck([](const Inputs& in) { return batch_norm(in[0], in[1], in[2], {}, {}, true); },
                  {x, w, b}));
}

TEST_CASE("batch_norm running statistics get no gradient and are updated in training",
          "[formulas-nn]") {
  Tensor x = leaf({4, 2, 3}, 51), w = leaf({2}, 52), b = leaf({2}, 53);
  Tensor running_mean = zeros({2}, {.dtype = DType::f64});
  Tensor running_var = ones({2}, {.dtype = DType::f64});
  // Even when the buffers require grad, the formula gives them none.
  running_mean.requires_grad_();
  running_var.requires_grad_();
  Tensor y = batch_norm(x, w, b, running_mean, running_var, true, 0.5);
  Tensor batch_mean, batch_var;
  {
    NoGradGuard no_grad;
    batch_mean = mean(x, {0, 2});
    // The unbiased variance over the 12 values of each channel.
    batch_var = sum(pow(x - batch_mean.reshape({1, 2, 1}), 2), {0, 2}) * (1.0 / 11.0);
  }
  CHECK(allclose(running_mean, batch_mean * 0.5, 1e-12, 1e-12));
  CHECK(allclose(running_var, batch_var * 0.5 + 0.5, 1e-12, 1e-12));
  y.backward(randn_like(y));
  CHECK(x.grad().defined());
  CHECK(w.grad().defined());
  CHECK(b.grad().defined());
  CHECK_FALSE(running_mean.grad().defined());
  CHECK_FALSE(running_var.grad().defined());
}

TEST_CASE("batch_norm gradient of the bias alone without a weight", "[formulas-nn]") {
  Tensor x = randn({3, 2}, {.dtype = DType::f64});
  Tensor b = leaf({2}, 54);
  CHECK(gradcheck([](const Inputs& in) { return batch_norm(in[0], {}, in[1], {}, {}, true); },
                  {x, b}));
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("layer_norm gradients with and without affine", "[formulas-nn]") {
  Tensor x = leaf({2, 3, 4}, 61);
  CHECK(gradcheck([](const Inputs& in) { return layer_norm(in[0], {4}); }, {x}));
  CHECK(gradcheck([](const Inputs& in) { return layer_norm(in[0], {3, 4}); }, {x}));
  Tensor w = leaf({4}, 62), b = leaf({4}, 63);
  CHECK(gradcheck([](const Inputs& in) { return layer_norm(in[0], {4}, in[1], in[2], 1e-3); },
                  {x, w, b}));
  Tensor w2 = leaf({3, 4}, 64);
  CHECK(gradcheck([](const Inputs& in) { return layer_norm(in[0], {3, 4}, in[1]); }, {x, w2}));
  Tensor b2 = leaf({3, 4}, 65);
  CHECK(gradcheck([](const Inputs& in) { return layer_norm(in[0], {3, 4}, {}, in[1]); }, {x, b2}));
}

TEST_CASE("softmax and log_softmax gradients over different dims", "[formulas-nn]") {
  Tensor x = leaf({2, 3, 4}, 71);
  for (int64_t dim : {0, 1, 2, -1, -2}) {
    CAPTURE(dim);
    CHECK(gradcheck([dim](const Inputs& in) { return softmax(in[0], dim); }, {x}));
    CHECK(gradcheck([dim](const Inputs& in) { return log_softmax(in[0], dim); }, {x}));
  }
  Tensor v = leaf({5}, 72);
  CHECK(gradcheck([](const Inputs& in) { return softmax(in[0], 0); }, {v}));
  CHECK(gradcheck([](const Inputs& in) { return log_softmax(in[0], -1); }, {v}));
}

TEST_CASE("nll_loss gradients with weights ignore_index and every reduction", "[formulas-nn]") {
  Tensor x = leaf({4, 3}, 81);
  const Tensor target = index_target({2, -100, 0, 1}, {4});
  const Tensor weight = tensor_of({0.5, 2, 1.5}, {3}, DType::f64);
  for (const char* reduction : {"none", "mean", "sum"}) {
    for (bool weighted : {false, true}) {
      CAPTURE(reduction, weighted);
      const NllLossOptions o{.weight = weighted ? weight : Tensor(), .reduction = reduction};
      CHECK(gradcheck([&](const Inputs& in) { return nll_loss(log_softmax(in[0], 1), target, o); },
                      {x}));
    }
  }
}

TEST_CASE("cross_entropy gradients with class indices smoothing weights and ignore_index",
          "[formulas-nn]") {
  struct Case {
    Shape logits;
    Tensor target;
  };
  const Case cases[] = {
      {{4, 3}, index_target({2, 1, 0, 1}, {4})},
      {{2, 3, 2}, index_target({0, 2, 1, 1}, {2, 2})},
      {{3}, index_target({1}, Shape{})},
  };
  const Tensor weight = tensor_of({0.5, 2, 1.5}, {3}, DType::f64);
  uint64_t seed = 90;
  for (const Case& k : cases) {
    Tensor x = leaf(k.logits, seed++);
    for (const char* reduction : {"none", "mean", "sum"}) {
      for (double smoothing : {0.0, 0.2}) {
        for (bool weighted : {false, true}) {
          for (int64_t ignore_index : {-100, 1}) {
            // Ignoring every target of the 0-d case makes "mean" NaN.
            if (k.logits.size() == 1 && ignore_index == 1) continue;
            CAPTURE(shape_str(k.logits), reduction, smoothing, weighted, ignore_index);
            const CrossEntropyOptions o{.weight = weighted ? weight : Tensor(),
                                        .ignore_index = ignore_index,
                                        .reduction = reduction,
                                        .label_smoothing = smoothing};
            CHECK(gradcheck([&](const Inputs& in) { return cross_entropy(in[0], k.target, o); },
                            {x}));
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy gradients with class probabilities for logits and targets",
          "[formulas-nn]") {
  const Tensor weight = tensor_of({0.5, 2, 1.5}, {3}, DType::f64);
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 2}, Shape{3}}) {
    Tensor x = leaf(shape, 101);
    Tensor probs = leaf(shape, 102, 0.1, 1.0);
    for (const char* reduction : {"none", "mean", "sum"}) {
      for (double smoothing : {0.0, 0.3}) {
        for (bool weighted : {false, true}) {
          CAPTURE(shape_str(shape), reduction, smoothing, weighted);
          const CrossEntropyOptions o{.weight = weighted ? weight : Tensor(),
                                      .reduction = reduction,
                                      .label_smoothing = smoothing};
          CHECK(gradcheck([&](const Inputs& in) { return cross_entropy(in[0], in[1], o); },
                          {x, probs}));
        }
      }
    }
  }
}

TEST_CASE("linear_cross_entropy gradients for input, weight and bias", "[formulas-nn]") {
  const std::string reduction = GENERATE("mean", "sum");
  // Rows 1 and 4 ignored: their gradient is zero, which the finite differences see too.
  const Tensor t = index_target({2, -100, 0, 3, -100, 1}, {6});
  const Tensor x = leaf({6, 3}, 71), w = leaf({4, 3}, 72), b = leaf({4}, 73);
  CHECK(gradcheck(
      [&](const Inputs& in) { return linear_cross_entropy(in[0], in[1], in[2], t, {.reduction = reduction}); },
      {x, w, b}));
  CHECK(gradcheck([&](const Inputs& in) { return linear_cross_entropy(in[0], in[1], {}, t); }, {x, w}));
}

TEST_CASE("mse_loss gradients for both operands with broadcasting", "[formulas-nn]") {
  for (const char* reduction : {"none", "mean", "sum"}) {
    CAPTURE(reduction);
    Tensor a = leaf({2, 3, 4}, 111), b = leaf({3, 1}, 112);
    CHECK(gradcheck([&](const Inputs& in) { return mse_loss(in[0], in[1], reduction); }, {a, b}));
    Tensor c = leaf({4}, 113), d = leaf({2, 1, 4}, 114);
    CHECK(gradcheck([&](const Inputs& in) { return mse_loss(in[0], in[1], reduction); }, {c, d}));
  }
  // A target that needs no gradient gets none.
  Tensor a = leaf({2, 3}, 115), t = randn({2, 3}, {.dtype = DType::f64});
  CHECK(gradcheck([](const Inputs& in) { return mse_loss(in[0], in[1]); }, {a, t}));
  CHECK_FALSE(t.grad().defined());
}

// conv -> batch_norm -> relu -> max_pool -> flatten -> matmul -> cross_entropy, end to end.
TEST_CASE("a tiny conv net has correct gradients end to end", "[formulas-nn]") {
  Tensor x = leaf({2, 1, 6, 6}, 121);
  Tensor conv_w = leaf({2, 1, 3, 3}, 122), conv_b = leaf({2}, 123);
  Tensor bn_w = leaf({2}, 124), bn_b = leaf({2}, 125);
  Tensor fc = leaf({8, 3}, 126);  // 2 channels x 2 x 2 after pooling -> 3 classes
  Tensor running_mean = zeros({2}, {.dtype = DType::f64});
  Tensor running_var = ones({2}, {.dtype = DType::f64});
  const Tensor target = index_target({2, 0}, {2});
  auto net = [&](const Inputs& in) {
    Tensor h = conv2d(in[0], in[1], in[2], {.padding = {1, 1}});
    h = batch_norm(h, in[3], in[4], running_mean, running_var, true);
    h = max_pool2d(relu(h), {3});
    return cross_entropy(matmul(h.flatten(1), in[5]), target, {.label_smoothing = 0.1});
  };
  CHECK(gradcheck(net, {x, conv_w, conv_b, bn_w, bn_b, fc}));
}

TEST_CASE("a batch_norm used twice before backward still backpropagates", "[formulas-nn]") {
  // The second call updates the running statistics in place; the first call's node must
  // not have saved them.
  Tensor x = randn({4, 3, 2, 2}, {.dtype = DType::f64}).requires_grad_();
  Tensor rm = zeros({3}, {.dtype = DType::f64}), rv = ones({3}, {.dtype = DType::f64});
  Tensor y1 = batch_norm(x, {}, {}, rm, rv, true, 0.1, 1e-5);
  Tensor y2 = batch_norm(x * 2, {}, {}, rm, rv, true, 0.1, 1e-5);
  (sum(y1 * y1) + sum(y2 * x)).backward();
  CHECK(x.grad().defined());
  CHECK(gradcheck([&](const std::vector<Tensor>& in) {
    return batch_norm(in[0], {}, {}, rm, rv, true, 0.1, 1e-5) +
           batch_norm(in[0] * 2, {}, {}, rm, rv, true, 0.1, 1e-5) * in[0];
  }, {x}));
}
