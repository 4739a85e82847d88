// The layers against the ops they wrap, their shapes and default initialization, BatchNorm's
// running statistics, nn::functional, and the initializers' statistics.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/autocast.h"
#include "models/functional.h"
#include "models/init.h"
#include "models/layers.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;
using kiln::testing::tensor_of;
using kiln::testing::values;
namespace F = kiln::nn::functional;

namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST_CASE("Linear matches x W^T + b and keeps leading dims", "[modules]") {
  manual_seed(0);
  nn::Linear linear(4, 3);
  Tensor x = randn({2, 5, 4});
  Tensor y = linear(x);
  CHECK(y.shape() == Shape{2, 5, 3});
  KILN_CHECK_CLOSE(y, matmul(x, linear.weight().t()) + linear.bias(), 1e-6, 1e-6);
  KILN_CHECK_CLOSE(y, F::linear(x, linear.weight(), linear.bias()), 0, 0);
  nn::Linear no_bias(4, 3, {.bias = false});
  KILN_CHECK_CLOSE(no_bias(x), matmul(x, no_bias.weight().t()), 0, 0);
  CHECK_THROWS_WITH(linear(randn({2, 5})), Catch::Contains("linear") && Catch::Contains("[2,5]"));
}

TEST_CASE("under autocast linear and matmul_bias give autocast's dtype, the bias added before rounding",
          "[modules][autocast]") {
  // As PyTorch's linear and addmm: the operands and the bias in bf16, the sums in f32, one
  // rounding to bf16 at the end (a bf16 product plus the f32 bias would promote to f32).
  manual_seed(0);
  const Tensor x = randn({2, 5, 8}), w = randn({3, 8}), b = randn({3});
  auto bf16 = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f64); };
  // Reference: the bf16 operands' exact products and sums in f64, rounded once to bf16.
  const Tensor exact = (matmul(bf16(x), bf16(w).t()) + bf16(b)).to(DType::bf16);
  Tensor y, y_in_out, y_no_bias;
  {
    autocast scope({.device_type = DeviceType::cpu, .dtype = DType::bf16});
    y = F::linear(x, w, b);
    y_in_out = F::matmul_bias(x, w.t(), b);  // GPT-2's Conv1D: the weight stored [in, out]
    y_no_bias = F::linear(x, w);
  }
  CHECK(y.dtype() == DType::bf16);
  CHECK(y.shape() == Shape{2, 5, 3});
  CHECK(y_no_bias.dtype() == DType::bf16);
  // f32 sums of 9 terms are within 9 * 2^-24 of exact relative to the magnitudes, far below
  // half a bf16 ulp (2^-9): the rounding to bf16 differs from the exact one at most where
  // the exact value lies within that of a rounding boundary, by one bf16 ulp there.
  KILN_CHECK_CLOSE(y.to(DType::f64), exact.to(DType::f64), 1.0 / 128, 0);
  KILN_CHECK_CLOSE(y_in_out, y, 0, 0);
  // Outside autocast: x W^T + b in f32, as before.
  KILN_CHECK_CLOSE(F::matmul_bias(x, w.t(), b), matmul(x, w.t()) + b, 0, 0);
  // The gradients reach the f32 parameters in f32.
  Tensor wp = w.clone().requires_grad_(true), bp = b.clone().requires_grad_(true);
  {
    autocast scope({.device_type = DeviceType::cpu, .dtype = DType::bf16});
    sum(F::linear(x, wp, bp).to(DType::f32)).backward();
  }
  CHECK(wp.grad().dtype() == DType::f32);
  CHECK(bp.grad().dtype() == DType::f32);
  KILN_CHECK_CLOSE(bp.grad(), full({3}, 10.0, {.dtype = DType::f32}), 0, 0);  // 2 x 5 rows of ones
}

TEST_CASE("Linear and Conv2d are initialized within 1 over sqrt fan_in", "[modules]") {
  manual_seed(0);
  nn::Linear linear(16, 64);
  const double bound = 1.0 / std::sqrt(16.0);  // kaiming_uniform(a = sqrt 5) gives this bound
  CHECK(max_abs(linear.weight()) <= bound);
  CHECK(max_abs(linear.weight()) > 0.9 * bound);  // 1024 draws reach close to it
  CHECK(max_abs(linear.bias()) <= bound);
  nn::Conv2d conv(4, 8, 3, {.groups = 2});
  CHECK(conv.weight().shape() == Shape{8, 2, 3, 3});
  const double conv_bound = 1.0 / std::sqrt(2.0 * 9.0);
  CHECK(max_abs(conv.weight()) <= conv_bound);
  CHECK(max_abs(conv.bias()) <= conv_bound);
}

TEST_CASE("Conv2d matches conv2d with its options", "[modules]") {
  manual_seed(0);
  nn::Conv2d conv(3, 6, {3, 2}, {.stride = 2, .padding = {1, 0}, .dilation = 1, .groups = 3});
  Tensor x = randn({2, 3, 7, 6});
  Tensor y = conv(x);
  CHECK(y.shape() == Shape{2, 6, 4, 3});
  KILN_CHECK_CLOSE(
      y,
      F::conv2d(x, conv.weight(), conv.bias(), {.stride = {2, 2}, .padding = {1, 0}, .groups = 3}),
      0, 0);
  CHECK(conv.extra_repr() == "3, 6, kernel_size=(3, 2), stride=(2, 2), padding=(1, 0), groups=3");
  CHECK_THROWS_AS(nn::Conv2d(3, 4, 3, {.groups = 2}), Error);
}

TEST_CASE("BatchNorm2d updates running statistics in training only", "[modules]") {
  manual_seed(0);
  nn::BatchNorm2d bn(2);
  Tensor x = randn({4, 2, 3, 3}) * 2.0 + 1.0;
  Tensor y = bn(x);
  // Training: normalized by the batch's statistics (biased variance).
  Tensor mean = kiln::mean(x, {0, 2, 3}, true);
  Tensor var = kiln::var(x, {0, 2, 3}, 0, true);
  KILN_CHECK_CLOSE(y, (x - mean) / sqrt(var + 1e-5), 1e-5, 1e-5);
  // running = 0.9 running + 0.1 batch, with the unbiased variance.
  KILN_CHECK_CLOSE(bn.running_mean(), mean.flatten() * 0.1, 1e-5, 1e-6);
  KILN_CHECK_CLOSE(bn.running_var(), kiln::var(x, {0, 2, 3}) * 0.1 + 0.9, 1e-5, 1e-6);
  CHECK(bn.num_batches_tracked().item<int64_t>() == 1);

  bn.eval();
  const std::vector<double> mean_before = values(bn.running_mean());
  const std::vector<double> var_before = values(bn.running_var());
  Tensor x2 = randn({2, 2, 3, 3});
  Tensor y2 = bn(x2);
  CHECK(values(bn.running_mean()) == mean_before);
  CHECK(values(bn.running_var()) == var_before);
  CHECK(bn.num_batches_tracked().item<int64_t>() == 1);
  Tensor rm = bn.running_mean().view({1, 2, 1, 1}), rv = bn.running_var().view({1, 2, 1, 1});
  KILN_CHECK_CLOSE(y2, (x2 - rm) / sqrt(rv + 1e-5), 1e-5, 1e-5);
  CHECK_THROWS_WITH(bn(randn({2, 2, 3})), Catch::Contains("4-d") && Catch::Contains("[2,2,3]"));
  CHECK_THROWS_AS(bn(randn({2, 3, 3, 3})), Error);
  CHECK_THROWS_WITH(nn::BatchNorm2d(0), Catch::Contains("BatchNorm2d: num_features"));
}

TEST_CASE("BatchNorm1d with momentum none averages the batches seen", "[modules]") {
  manual_seed(0);
  nn::BatchNorm1d bn(3, {.momentum = std::nullopt});
  Tensor a = randn({5, 3}), b = randn({5, 3, 2});
  bn(a);
  bn(b);
  CHECK(bn.num_batches_tracked().item<int64_t>() == 2);
  Tensor expected = (kiln::mean(a, {0}) + kiln::mean(b, {0, 2})) * 0.5;
  KILN_CHECK_CLOSE(bn.running_mean(), expected, 1e-5, 1e-6);
  CHECK(bn.extra_repr() == "3, eps=1e-05, momentum=None, affine=True, track_running_stats=True");
  nn::BatchNorm1d untracked(3, {.affine = false, .track_running_stats = false});
  CHECK(untracked.parameters().empty());
  CHECK(untracked.buffers().empty());
  untracked.eval();  // no running statistics: the batch's are used
  KILN_CHECK_CLOSE(untracked(a), F::batch_norm(a, {}, {}, {}, {}, true), 0, 0);
}

TEST_CASE("LayerNorm matches layer_norm and starts as ones and zeros", "[modules]") {
  manual_seed(0);
  nn::LayerNorm ln({3, 4});
  KILN_CHECK_EQUAL(ln.weight(), ones({3, 4}));
  KILN_CHECK_EQUAL(ln.bias(), zeros({3, 4}));
  nn::init::normal_(ln.weight());
  Tensor x = randn({2, 3, 4});
  KILN_CHECK_CLOSE(ln(x), F::layer_norm(x, {3, 4}, ln.weight(), ln.bias()), 0, 0);
  CHECK(nn::LayerNorm({8}).extra_repr() == "(8,), eps=1e-05, elementwise_affine=True");
  CHECK(nn::LayerNorm({8}, {.bias = false}).parameters().size() == 1);
}

TEST_CASE("activation layers match their ops", "[modules]") {
  manual_seed(0);
  Tensor x = randn({2, 5});
  KILN_CHECK_CLOSE(nn::ReLU()(x), F::relu(x), 0, 0);
  KILN_CHECK_CLOSE(nn::GELU()(x), F::gelu(x), 0, 0);
  KILN_CHECK_CLOSE(nn::GELU("tanh")(x), F::gelu(x, "tanh"), 0, 0);
  KILN_CHECK_CLOSE(nn::SiLU()(x), F::silu(x), 0, 0);
  KILN_CHECK_CLOSE(nn::Sigmoid()(x), F::sigmoid(x), 0, 0);
  KILN_CHECK_CLOSE(nn::Tanh()(x), F::tanh(x), 0, 0);
  KILN_CHECK_CLOSE(nn::Identity()(x), x, 0, 0);
  CHECK(nn::GELU("tanh").str() == "GELU(approximate='tanh')");
  CHECK_THROWS_AS(nn::GELU("fast"), Error);
}

TEST_CASE("Dropout drops in training and is the identity in eval", "[modules]") {
  nn::Dropout drop(0.25);
  Tensor x = ones({64});
  manual_seed(7);
  Tensor y = drop(x);
  manual_seed(7);
  KILN_CHECK_CLOSE(y, F::dropout(x, 0.25, true), 0, 0);
  for (double v : values(y)) CHECK((v == 0.0 || std::fabs(v - 1.0 / 0.75) < 1e-6));
  drop.eval();
  KILN_CHECK_EQUAL(drop(x), x);
  CHECK(drop.str() == "Dropout(p=0.25, inplace=False)");
  CHECK_THROWS_AS(nn::Dropout(1.5), Error);
}

TEST_CASE("pooling layers match their ops and shapes", "[modules]") {
  manual_seed(0);
  Tensor x = randn({2, 3, 7, 6});
  nn::MaxPool2d max_pool(3, {.stride = 2, .padding = 1});
  CHECK(max_pool(x).shape() == Shape{2, 3, 4, 3});
  KILN_CHECK_CLOSE(max_pool(x), F::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}), 0, 0);
  CHECK(max_pool.str() == "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)");
  nn::AvgPool2d avg_pool(2);
  CHECK(avg_pool(x).shape() == Shape{2, 3, 3, 3});
  KILN_CHECK_CLOSE(avg_pool(x), F::avg_pool2d(x, {2, 2}), 0, 0);
  CHECK(avg_pool.extra_repr() == "kernel_size=2, stride=2, padding=0");
  nn::AdaptiveAvgPool2d adaptive({1, 2});
  CHECK(adaptive(x).shape() == Shape{2, 3, 1, 2});
  KILN_CHECK_CLOSE(adaptive(x), F::adaptive_avg_pool2d(x, {1, 2}), 0, 0);
  CHECK(adaptive.extra_repr() == "output_size=(1, 2)");
}

TEST_CASE("Flatten and Sequential compose a small CNN", "[modules]") {
  manual_seed(0);
  nn::Sequential cnn(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(),
                     nn::MaxPool2d(2), nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(4, 3));
  Tensor x = randn({2, 1, 8, 8});
  CHECK(cnn(x).shape() == Shape{2, 3});
  CHECK(nn::Flatten()(x).shape() == Shape{2, 64});
  CHECK(nn::Flatten(0, 1)(x).shape() == Shape{2, 8, 8});
  CHECK(cnn.size() == 7);
  cnn.push_back(nn::Identity());
  CHECK(cnn[7].type_name() == "Identity");
  Tensor loss = F::cross_entropy(cnn(x), tensor_of({0, 2}, {2}, DType::i64));
  CHECK(loss.dim() == 0);
}

TEST_CASE("Embedding looks up rows and zeroes the padding row", "[modules]") {
  manual_seed(0);
  nn::Embedding emb(10, 3, {.padding_idx = -1});
  CHECK(emb.padding_idx() == 9);
  KILN_CHECK_EQUAL(emb.weight()[9], zeros({3}));
  Tensor idx = tensor_of({1, 9, 4, 1}, {2, 2}, DType::i64);
  Tensor y = emb(idx);
  CHECK(y.shape() == Shape{2, 2, 3});
  KILN_CHECK_EQUAL(y[0][0], emb.weight()[1]);
  KILN_CHECK_EQUAL(y[1][0], emb.weight()[4]);
  CHECK(emb.str() == "Embedding(10, 3, padding_idx=9)");
  CHECK_THROWS_AS(nn::Embedding(4, 2, {.padding_idx = 4}), Error);
  // N(0, 1) initialization: the std of 4096 draws is within 0.1 of 1.
  CHECK(std_of(values(nn::Embedding(1024, 4).weight())) == Approx(1.0).margin(0.1));
}

TEST_CASE("calculate_fans and gains follow torch.nn.init", "[modules]") {
  auto fans = nn::init::calculate_fans(empty({8, 4, 3, 3}));
  CHECK(fans.fan_in == 36);
  CHECK(fans.fan_out == 72);
  CHECK_THROWS_WITH(nn::init::calculate_fans(empty({5})), Catch::Contains("at least 2 dims"));
  using nn::init::Nonlinearity;
  CHECK(nn::init::calculate_gain(Nonlinearity::relu) == Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain(Nonlinearity::leaky_relu, std::sqrt(5.0)) ==
        Approx(std::sqrt(1.0 / 3.0)));
  CHECK(nn::init::calculate_gain(Nonlinearity::tanh) == Approx(5.0 / 3.0));
}

TEST_CASE("initializer statistics match their formulas", "[modules]") {
  // 65536 draws: the sample std is within about 0.3% of the true one (1 sigma); we allow 3%.
  manual_seed(0);
  Tensor w = empty({256, 256});
  nn::init::kaiming_normal_(w, {.nonlinearity = nn::init::Nonlinearity::relu});
  CHECK(std_of(values(w)) == Approx(std::sqrt(2.0 / 256.0)).epsilon(0.03));
  CHECK(mean_of(values(w)) == Approx(0.0).margin(0.003));

  nn::init::kaiming_uniform_(w, {.mode = nn::init::FanMode::fan_out});  // leaky_relu, a = 0
  const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 256.0);
  CHECK(max_abs(w) <= bound);
  CHECK(std_of(values(w)) == Approx(bound / std::sqrt(3.0)).epsilon(0.03));

  Tensor rect = empty({128, 384});
  nn::init::xavier_uniform_(rect);
  CHECK(max_abs(rect) <= std::sqrt(6.0 / 512.0));
  nn::init::xavier_normal_(rect, 2.0);
  CHECK(std_of(values(rect)) == Approx(2.0 * std::sqrt(2.0 / 512.0)).epsilon(0.03));

  nn::init::trunc_normal_(w, 1.0, 2.0, -1.0, 2.0);
  const auto v = values(w);
  CHECK(*std::min_element(v.begin(), v.end()) >= -1.0);
  CHECK(*std::max_element(v.begin(), v.end()) <= 2.0);
  CHECK_THROWS_AS(nn::init::trunc_normal_(w, 0.0, 1.0, 20.0, 21.0), Error);

  nn::init::constant_(w, 0.5);
  KILN_CHECK_EQUAL(w, full({256, 256}, 0.5));
  nn::init::ones_(w);
  KILN_CHECK_EQUAL(w, ones({256, 256}));
  CHECK_THROWS_AS(nn::init::normal_(zeros({2}, {.dtype = DType::i64})), Error);
}

TEST_CASE("initializers are reproducible under manual_seed and fill parameters", "[modules]") {
  manual_seed(42);
  nn::Linear a(8, 8);
  manual_seed(42);
  nn::Linear b(8, 8);
  KILN_CHECK_EQUAL(a.weight(), b.weight());
  KILN_CHECK_EQUAL(a.bias(), b.bias());
  nn::init::trunc_normal_(a.weight(), 0.0, 0.02);  // a parameter that requires grad
  CHECK(a.weight().requires_grad());
  CHECK(a.weight().is_leaf());
  CHECK(max_abs(a.weight()) <= 2.0);
}
