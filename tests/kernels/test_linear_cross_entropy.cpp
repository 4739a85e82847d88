// linear_cross_entropy and its backward op against a naive f64 loop, against the op chain
// it stands for (matmul, bias, log_softmax, nll_loss and their autograd), and its errors.
#include <cmath>
#include <limits>
#include <string>

#include "core/ops/linalg.h"
#include "core/ops/linear_cross_entropy.h"
#include "core/ops/loss.h"
#include "kernels/linear_cross_entropy_composed.h"
#include "core/ops/reduce.h"
#include "testing.h"

using namespace kiln;

namespace {

constexpr double kU32 = 0x1p-24;  // f32's unit roundoff

// The op's results, worked out in f64 from the f64 values of its operands, with the
// magnitudes the f32 error bounds scale with.
struct Reference {
  double loss = 0;
  int64_t correct = 0;
  std::vector<double> lse, dx, dw, db;
  // |G| @ |W| and |G|^T @ |X| and column sums of |G| (G the logits' gradient): the sums the
  // f32 products' rounding is bounded by; dot_max: the largest sum of |x_k w_k| of a logit.
  std::vector<double> dx_mag, dw_mag, db_mag;
  double dot_max = 0;
};

Reference reference(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& t, int64_t ignore_index,
                    const std::string& reduction, double grad_loss) {
  const int64_t m = x.size(0), h = x.size(1), v = w.size(0);
  const std::vector<double> xv = testing::values(x), wv = testing::values(w);
  const std::vector<double> bv = b.defined() ? testing::values(b) : std::vector<double>(static_cast<size_t>(v), 0.0);
  const std::vector<double> tv = testing::values(t);
  Reference r;
  r.lse.assign(static_cast<size_t>(m), 0.0);
  r.dx.assign(static_cast<size_t>(m * h), 0.0);
  r.dx_mag = r.dx;
  r.dw.assign(static_cast<size_t>(v * h), 0.0);
  r.dw_mag = r.dw;
  r.db.assign(static_cast<size_t>(v), 0.0);
  r.db_mag = r.db;
  int64_t count = 0;
  for (int64_t i = 0; i < m; ++i) count += static_cast<int64_t>(tv[static_cast<size_t>(i)]) != ignore_index;
  const double scale = grad_loss / (reduction == "mean" ? static_cast<double>(count) : 1.0);
  std::vector<double> logits(static_cast<size_t>(v)), g(static_cast<size_t>(v));
  for (int64_t i = 0; i < m; ++i) {
    const auto target = static_cast<int64_t>(tv[static_cast<size_t>(i)]);
    if (target == ignore_index) continue;
    double max = -std::numeric_limits<double>::infinity();
    int64_t argmax = 0;
    for (int64_t k = 0; k < v; ++k) {
      double dot = bv[static_cast<size_t>(k)], mag = std::fabs(bv[static_cast<size_t>(k)]);
      for (int64_t j = 0; j < h; ++j) {
        dot += xv[static_cast<size_t>(i * h + j)] * wv[static_cast<size_t>(k * h + j)];
        mag += std::fabs(xv[static_cast<size_t>(i * h + j)] * wv[static_cast<size_t>(k * h + j)]);
      }
      logits[static_cast<size_t>(k)] = dot;
      r.dot_max = std::max(r.dot_max, mag);
      if (dot > max) max = dot, argmax = k;
    }
    double sum = 0;
    for (int64_t k = 0; k < v; ++k) sum += std::exp(logits[static_cast<size_t>(k)] - max);
    const double lse = max + std::log(sum);
    r.lse[static_cast<size_t>(i)] = lse;
    r.loss += lse - logits[static_cast<size_t>(target)];
    r.correct += argmax == target;
    for (int64_t k = 0; k < v; ++k)
      g[static_cast<size_t>(k)] = scale * (std::exp(logits[static_cast<size_t>(k)] - lse) - (k == target ? 1.0 : 0.0));
    for (int64_t k = 0; k < v; ++k) {
      const double gk = g[static_cast<size_t>(k)];
      r.db[static_cast<size_t>(k)] += gk;
      r.db_mag[static_cast<size_t>(k)] += std::fabs(gk);
      for (int64_t j = 0; j < h; ++j) {
        const double xij = xv[static_cast<size_t>(i * h + j)], wkj = wv[static_cast<size_t>(k * h + j)];
        r.dx[static_cast<size_t>(i * h + j)] += gk * wkj;
        r.dx_mag[static_cast<size_t>(i * h + j)] += std::fabs(gk * wkj);
        r.dw[static_cast<size_t>(k * h + j)] += gk * xij;
        r.dw_mag[static_cast<size_t>(k * h + j)] += std::fabs(gk * xij);
      }
    }
  }
  if (reduction == "mean") r.loss /= static_cast<double>(count);
  return r;
}

// |actual - expected| <= rel * magnitude + abs_floor per element.
bool within(const Tensor& actual, const std::vector<double>& expected, const std::vector<double>& magnitude,
            double rel, double abs_floor) {
  const std::vector<double> a = testing::values(actual);
  if (a.size() != expected.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - expected[i]) <= rel * magnitude[i] + abs_floor)) {
      UNSCOPED_INFO("element " << i << ": " << a[i] << " vs " << expected[i] << " (bound "
                                << rel * magnitude[i] + abs_floor << ")");
      return false;
    }
  return true;
}

Tensor random(Shape shape, DType dtype, uint64_t seed, double scale = 1.0) {
  manual_seed(seed);
  return (randn(std::move(shape), {.dtype = DType::f64}) * scale).to(dtype);
}

// Targets in [0, v), every third (from `phase`) ignored.
Tensor targets(int64_t m, int64_t v, int64_t ignore_index, int64_t phase = 0) {
  std::vector<int64_t> t(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) t[static_cast<size_t>(i)] = (i + phase) % 3 == 0 ? ignore_index : (i * 7 + 3) % v;
  return from_vector(t, {m});
}

}  // namespace

TEST_CASE("linear_cross_entropy equals a naive f64 loop", "[linear_cross_entropy][loss]") {
  const DType dtype = GENERATE(DType::f64, DType::f32);
  const std::string reduction = GENERATE("mean", "sum");
  const bool with_bias = GENERATE(true, false);
  // 37 rows, 24 features, 300 classes: more than one 256-column block of the bias sums and
  // rows that are no multiple of the 16 lanes.
  const int64_t m = 37, h = 24, v = 300, ignore = -100;
  const Tensor x = random({m, h}, dtype, 1), w = random({v, h}, dtype, 2, 0.5);
  const Tensor b = with_bias ? random({v}, dtype, 3) : Tensor();
  const Tensor t = targets(m, v, ignore);
  const LinearCrossEntropyOptions options{.ignore_index = ignore, .reduction = reduction};
  INFO(name(dtype) << " " << reduction << (with_bias ? " with bias" : " without bias"));

  const LinearCrossEntropyResult out = linear_cross_entropy_with_stats(x, w, b, t, options);
  const double grad_loss = 0.75;
  const Tensor g = full({}, grad_loss, {.dtype = dtype});
  const LinearCrossEntropyGrads grads =
      linear_cross_entropy_backward(g, x, w, b, t, out.log_sum_exp, out.logits, options);
  const Reference r = reference(x, w, b, t, ignore, reduction, grad_loss);

  CHECK(out.loss.dtype() == dtype);
  CHECK(out.correct.item<int64_t>() == r.correct);
  // f64: the products and sums round at 2^-53 per step; 1e-12 relative covers sums of a few
  // hundred terms. f32: each logit is off by at most gamma_H * sum|x_k w_k| (H multiply-adds
  // at unit roundoff u), the row's lse and exp by a few u more; every gradient element is a
  // sum over V (dx) or over the rows (dw, db) of G's elements, each off by that relative
  // error, plus gamma_V of its magnitude.
  const double u = dtype == DType::f64 ? 0x1p-53 : kU32;
  const double logit_err = (h + 2) * u * r.dot_max;
  const double rel = dtype == DType::f64 ? 1e-12 : 2 * logit_err + (v + 8) * u;
  const double loss_mag = reduction == "mean" ? 1.0 : 1.0 * static_cast<double>(m);
  CHECK(std::fabs(out.loss.item<double>() - r.loss) <= (2 * logit_err + 8 * u) * loss_mag + 1e-12);
  CHECK(within(out.log_sum_exp, r.lse, std::vector<double>(r.lse.size(), 1.0), 2 * logit_err + 8 * u, 1e-12));
  CHECK(within(grads.grad_input, r.dx, r.dx_mag, rel, 0));
  CHECK(within(grads.grad_weight, r.dw, r.dw_mag, rel, 0));
  CHECK(within(grads.grad_bias, r.db, r.db_mag, rel, 0));
}

TEST_CASE("linear_cross_entropy equals the op chain it replaces, with its autograd", "[linear_cross_entropy][loss]") {
  const std::string reduction = GENERATE("mean", "sum");
  const int64_t ignore = GENERATE(int64_t{-100}, int64_t{2});
  const int64_t m = 11, h = 5, v = 7;
  Tensor x = random({m, h}, DType::f64, 4).requires_grad_();
  Tensor w = random({v, h}, DType::f64, 5).requires_grad_();
  Tensor b = random({v}, DType::f64, 6).requires_grad_();
  const Tensor t = targets(m, v, ignore, 1);
  INFO(reduction << ", ignore_index " << ignore);

  const Tensor fused = linear_cross_entropy(x, w, b, t, {.ignore_index = ignore, .reduction = reduction});
  (fused * 1.5).backward();
  const Tensor dx = x.grad(), dw = w.grad(), db = b.grad();
  x.set_grad({}), w.set_grad({}), b.set_grad({});
  const Tensor chain =
      cross_entropy(matmul(x, w.permute({1, 0})) + b, t, {.ignore_index = ignore, .reduction = reduction});
  (chain * 1.5).backward();
  KILN_CHECK_CLOSE(fused, chain, 1e-13, 1e-13);
  KILN_CHECK_CLOSE(dx, x.grad(), 1e-12, 1e-13);
  KILN_CHECK_CLOSE(dw, w.grad(), 1e-12, 1e-13);
  KILN_CHECK_CLOSE(db, b.grad(), 1e-12, 1e-13);
  // An ignored row's gradient is exactly zero.
  for (int64_t i = 0; i < m; ++i)
    if (t.select(0, i).item<int64_t>() == ignore) KILN_CHECK_EQUAL(dx.select(0, i), zeros({h}, {.dtype = DType::f64}));
}

TEST_CASE("linear_cross_entropy: every target ignored, ties and the count of correct rows",
          "[linear_cross_entropy][loss]") {
  const int64_t m = 4, h = 3, v = 5;
  const Tensor x = random({m, h}, DType::f32, 7), w = random({v, h}, DType::f32, 8);
  const Tensor none = full({m}, -100, {.dtype = DType::i64});
  SECTION("mean over no target is NaN, sum is 0, and the gradients are zero") {
    const LinearCrossEntropyResult mean = linear_cross_entropy_with_stats(x, w, {}, none);
    CHECK(std::isnan(mean.loss.item<double>()));
    CHECK(mean.correct.item<int64_t>() == 0);
    const LinearCrossEntropyResult sum = linear_cross_entropy_with_stats(x, w, {}, none, {.reduction = "sum"});
    CHECK(sum.loss.item<double>() == 0.0);
    const LinearCrossEntropyGrads g = linear_cross_entropy_backward(ones({}), x, w, {}, none, sum.log_sum_exp,
                                                                    sum.logits, {.reduction = "sum"});
    KILN_CHECK_EQUAL(g.grad_input, zeros({m, h}));
    KILN_CHECK_EQUAL(g.grad_weight, zeros({v, h}));
    KILN_CHECK_EQUAL(g.grad_bias, zeros({v}));
  }
  SECTION("equal logits: the first class is the argmax, as argmax says") {
    const Tensor same = zeros({v, h});  // every logit 0
    const Tensor t = from_vector(std::vector<int64_t>{0, 1, 0, 4}, {m});
    const LinearCrossEntropyResult r = linear_cross_entropy_with_stats(x, same, {}, t);
    CHECK(r.correct.item<int64_t>() == 2);
    CHECK(std::fabs(r.loss.item<double>() - std::log(5.0)) <= 4 * kU32 * std::log(5.0));
  }
  SECTION("the count matches argmax of the logits over the counted rows") {
    const Tensor t = from_vector(std::vector<int64_t>{1, -100, 3, 0}, {m});
    const Tensor logits = matmul(x, w.permute({1, 0}));
    const Tensor hits = sum(eq(argmax(logits, -1), t));
    CHECK(linear_cross_entropy_with_stats(x, w, {}, t).correct.item<int64_t>() == hits.item<int64_t>());
  }
}

TEST_CASE("linear_cross_entropy: bad input is a kiln::Error naming the op", "[linear_cross_entropy][loss]") {
  const Tensor x = zeros({4, 3}), w = zeros({5, 3}), t = zeros({4}, {.dtype = DType::i64});
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, {}, from_vector(std::vector<int64_t>{0, 5, 1, 1}, {4})),
                    Catch::Contains("linear_cross_entropy: target 5 is out of bounds for 5 classes"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, zeros({5, 2}), {}, t),
                    Catch::Contains("linear_cross_entropy: input must be [M, H] and weight [V, H]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x.to(DType::bf16), w.to(DType::bf16), {}, t),
                    Catch::Contains("must all be f32 or all f64"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w.to(DType::f64), {}, t), Catch::Contains("f32 or all f64"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, zeros({4}), t), Catch::Contains("bias must be [5]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, {}, zeros({4})), Catch::Contains("target must be i64 [4]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, {}, t, {.reduction = "none"}),
                    Catch::Contains("reduction must be \"mean\" or \"sum\""));
}

// CUDA's kernels are the op composed of eager ops (kernels/linear_cross_entropy_composed.h);
// here they run on CPU tensors against the same naive loop. Bounds as the CPU kernels', but
// the composed log-sum-exp is logsumexp in the input's dtype, whose sum over V terms rounds
// at up to (V + 4) u rather than in f64.
TEST_CASE("linear_cross_entropy composed of eager ops (CUDA's kernels) equals a naive f64 loop",
          "[linear_cross_entropy][loss]") {
  const DType dtype = GENERATE(DType::f64, DType::f32);
  const std::string reduction = GENERATE("mean", "sum");
  const bool with_bias = GENERATE(true, false);
  const int64_t phase = GENERATE(int64_t{0}, int64_t{-1});  // -1: no target ignored
  const int64_t m = 37, h = 24, v = 300, ignore = -100;
  const Tensor x = random({m, h}, dtype, 11), w = random({v, h}, dtype, 12, 0.5);
  const Tensor b = with_bias ? random({v}, dtype, 13) : Tensor();
  // phase -1: every third target set to a class instead of ignored.
  const Tensor t = phase < 0 ? where(eq(targets(m, v, ignore), ignore), full({}, int64_t{5}), targets(m, v, ignore))
                             : targets(m, v, ignore, phase);
  const Attrs attrs{{"reduction", reduction}, {"ignore_index", ignore}};
  INFO(name(dtype) << " " << reduction << (with_bias ? " with bias" : " without bias") << " phase " << phase);

  const std::vector<Tensor> out = {empty({}, {.dtype = dtype}), empty({}, {.dtype = DType::i64}),
                                   empty({m}, {.dtype = DType::f64}), empty({m, v}, {.dtype = dtype})};
  linear_cross_entropy_composed(std::vector<Tensor>{x, w, b, t}, out, attrs);
  const double grad_loss = 0.75;
  const std::vector<Tensor> grads = {empty({m, h}, {.dtype = dtype}), empty({v, h}, {.dtype = dtype}),
                                     empty({v}, {.dtype = dtype})};
  linear_cross_entropy_backward_composed(std::vector<Tensor>{full({}, grad_loss, {.dtype = dtype}), x, w, b, t, out[2], out[3]}, grads,
                                         attrs);
  const Reference r = reference(x, w, b, t, ignore, reduction, grad_loss);

  CHECK(out[1].item<int64_t>() == r.correct);
  const double u = dtype == DType::f64 ? 0x1p-53 : kU32;
  const double logit_err = (h + 2) * u * r.dot_max;
  const double lse_err = 2 * logit_err + (v + 8) * u;
  const double rel = dtype == DType::f64 ? 1e-12 : 2 * lse_err + (v + 8) * u;
  const double loss_mag = reduction == "mean" ? 1.0 : 1.0 * static_cast<double>(m);
  CHECK(std::fabs(out[0].item<double>() - r.loss) <= lse_err * loss_mag + 1e-12);
  CHECK(within(out[2], r.lse, std::vector<double>(r.lse.size(), 1.0), lse_err, 1e-12));
  CHECK(within(grads[0], r.dx, r.dx_mag, rel, 0));
  CHECK(within(grads[1], r.dw, r.dw_mag, rel, 0));
  CHECK(within(grads[2], r.db, r.db_mag, rel, 0));
}

TEST_CASE("linear_cross_entropy composed: no target counted, and a target out of range",
          "[linear_cross_entropy][loss]") {
  const int64_t m = 4, h = 3, v = 5;
  const Tensor x = random({m, h}, DType::f32, 14), w = random({v, h}, DType::f32, 15);
  const Tensor none = full({m}, -100, {.dtype = DType::i64});
  const Attrs mean{{"reduction", std::string("mean")}, {"ignore_index", int64_t{-100}}};
  const std::vector<Tensor> out = {empty({}), empty({}, {.dtype = DType::i64}), empty({m}, {.dtype = DType::f64}),
                                   empty({m, v})};
  linear_cross_entropy_composed(std::vector<Tensor>{x, w, Tensor(), none}, out, mean);
  CHECK(std::isnan(out[0].item<double>()));
  CHECK(out[1].item<int64_t>() == 0);
  KILN_CHECK_EQUAL(out[2], zeros({m}, {.dtype = DType::f64}));
  const std::vector<Tensor> grads = {full({m, h}, 7.0), full({v, h}, 7.0), full({v}, 7.0)};
  linear_cross_entropy_backward_composed(std::vector<Tensor>{ones({}), x, w, Tensor(), none, out[2], out[3]}, grads, mean);
  KILN_CHECK_EQUAL(grads[0], zeros({m, h}));
  KILN_CHECK_EQUAL(grads[1], zeros({v, h}));
  KILN_CHECK_EQUAL(grads[2], zeros({v}));
  CHECK_THROWS_WITH(
      linear_cross_entropy_composed(std::vector<Tensor>{x, w, Tensor(), from_vector(std::vector<int64_t>{0, 5, 1, 1}, {4})}, out,
                                    mean),
      Catch::Contains("linear_cross_entropy: target 5 is out of bounds for 5 classes"));
}
