// nll_loss, cross_entropy (class indices and probabilities), mse_loss and their backward
// ops against naive f64 loops and hand-computed values.
#include <limits>
#include <string>

#include "core/ops/loss.h"
#include "core/ops/softmax.h"
#include "testing.h"

using namespace kiln;
using testing::tensor_of;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor targets(const std::vector<int64_t>& v, Shape shape) { return from_vector(v, shape); }

Tensor random(Shape shape, DType dtype = DType::f64, double scale = 2.0) {
  return (randn(std::move(shape), {.dtype = DType::f64}) * scale).to(dtype);
}

// An input with a class dim as [N, C, S] values (row-major) and its sizes.
struct Ncs {
  std::vector<double> v;
  int64_t n, c, s;
  explicit Ncs(const Tensor& x) : v(testing::values(x)) {
    c = x.dim() == 1 ? x.size(0) : x.size(1);
    n = x.dim() == 1 ? 1 : x.size(0);
    s = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  }
  double at(int64_t e, int64_t k) const { return v[(e / s) * c * s + k * s + e % s]; }
};

// log_softmax over the class dim, in f64.
Ncs reference_log_softmax(const Tensor& logits) {
  Ncs x(logits);
  Ncs y = x;
  for (int64_t e = 0; e < x.n * x.s; ++e) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t k = 0; k < x.c; ++k) max = std::max(max, x.at(e, k));
    for (int64_t k = 0; k < x.c; ++k) sum += std::exp(x.at(e, k) - max);
    for (int64_t k = 0; k < x.c; ++k)
      y.v[(e / x.s) * x.c * x.s + k * x.s + e % x.s] = x.at(e, k) - max - std::log(sum);
  }
  return y;
}

// PyTorch's class-index cross entropy from log-probabilities, written out term by term:
// (1 - ls) * nll + ls / C * smooth, "mean" dividing both by the summed target weights.
Tensor reference_class_loss(const Ncs& lp, const Tensor& target, const std::vector<double>& w,
                            int64_t ignore_index, double ls, const std::string& reduction) {
  const std::vector<double> t = testing::values(target);
  auto weight = [&](int64_t k) { return w.empty() ? 1.0 : w[static_cast<size_t>(k)]; };
  std::vector<double> per;
  double nll_sum = 0, smooth_sum = 0, total_weight = 0;
  for (int64_t e = 0; e < lp.n * lp.s; ++e) {
    const auto k = static_cast<int64_t>(t[static_cast<size_t>(e)]);
    double nll = 0, smooth = 0;
    if (k != ignore_index) {
      nll = -weight(k) * lp.at(e, k);
      for (int64_t c = 0; c < lp.c; ++c) smooth -= weight(c) * lp.at(e, c);
      total_weight += weight(k);
    }
    nll_sum += nll;
    smooth_sum += smooth;
    per.push_back((1 - ls) * nll + ls / static_cast<double>(lp.c) * smooth);
  }
  if (reduction == "none") return tensor_of(per, target.shape(), DType::f64);
  if (reduction == "sum")
    return tensor_of({(1 - ls) * nll_sum + ls / static_cast<double>(lp.c) * smooth_sum}, {},
                     DType::f64);
  return tensor_of({(1 - ls) * nll_sum / total_weight +
                    ls / static_cast<double>(lp.c) * smooth_sum / total_weight},
                   {}, DType::f64);
}

// PyTorch's probability-target cross entropy: "mean" divides by N * d1 * ...
Tensor reference_prob_loss(const Ncs& lp, const Ncs& target, const std::vector<double>& w,
                           double ls, const std::string& reduction, const Shape& none_shape) {
  std::vector<double> per;
  double sum = 0;
  for (int64_t e = 0; e < lp.n * lp.s; ++e) {
    double l = 0;
    for (int64_t c = 0; c < lp.c; ++c) {
      const double p = target.at(e, c) * (1 - ls) + ls / static_cast<double>(lp.c);
      l -= (w.empty() ? 1.0 : w[static_cast<size_t>(c)]) * p * lp.at(e, c);
    }
    per.push_back(l);
    sum += l;
  }
  if (reduction == "none") return tensor_of(per, none_shape, DType::f64);
  return tensor_of({reduction == "sum" ? sum : sum / static_cast<double>(lp.n * lp.s)}, {},
                   DType::f64);
}

// d/dx sum(g * f(x)) by central differences, x in f64 (h = 1e-5; the losses are at most
// quadratic, so the error is rounding only).
Tensor numeric_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                    const Tensor& g) {
  Tensor grad = zeros(x.shape(), {.dtype = DType::f64});
  const std::vector<double> gv = testing::values(g);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double sides[2];
    for (int s = 0; s < 2; ++s) {
      Tensor xp = x.contiguous().clone();
      xp.data_ptr<double>()[i] += s == 0 ? 1e-5 : -1e-5;
      const std::vector<double> yv = testing::values(f(xp));
      sides[s] = 0;
      for (size_t k = 0; k < yv.size(); ++k) sides[s] += gv[k] * yv[k];
    }
    grad.data_ptr<double>()[i] = (sides[0] - sides[1]) / 2e-5;
  }
  return grad;
}

Tensor grad_like(const Tensor& loss) { return random(loss.shape(), DType::f64, 1.0); }

}  // namespace

TEST_CASE("nll_loss: hand-checked values", "[loss]") {
  const Tensor lp = tensor_of({-1, -2, -3, -0.5, -1.5, -2.5}, {2, 3});
  const Tensor t = targets({0, 2}, {2});
  KILN_CHECK_EQUAL(nll_loss(lp, t), tensor_of({1.75}, {}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.reduction = "sum"}), tensor_of({3.5}, {}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.reduction = "none"}), tensor_of({1, 2.5}, {2}));
  // weight [1, 2, 3]: losses 1 * 1 and 3 * 2.5; "mean" divides by 1 + 3.
  const Tensor w = tensor_of({1, 2, 3}, {3});
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.weight = w, .reduction = "none"}), tensor_of({1, 7.5}, {2}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.weight = w, .reduction = "sum"}), tensor_of({8.5}, {}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.weight = w}), tensor_of({2.125}, {}));
  // ignore_index 2 drops the second target: mean 1 / 1.
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.weight = w, .ignore_index = 2}), tensor_of({1}, {}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.ignore_index = 2, .reduction = "none"}),
                   tensor_of({1, 0}, {2}));
  // A [C] input with a 0-d target.
  KILN_CHECK_EQUAL(nll_loss(tensor_of({-1, -2, -3}, {3}), targets({1}, {}), {.reduction = "none"}),
                   tensor_of({2}, {}));
}

TEST_CASE("cross_entropy: hand-checked values", "[loss]") {
  const Tensor logits = tensor_of({1, 2, 3}, {1, 3});
  const Tensor t = targets({2}, {1});
  // Tolerance 1e-6: the constants carry 8 digits.
  KILN_CHECK_CLOSE(cross_entropy(logits, t), tensor_of({0.40760596}, {}), 1e-6, 0);
  // ls = 0.1: 0.9 * 0.40760596 + 0.1 / 3 * (2.40760596 + 1.40760596 + 0.40760596).
  KILN_CHECK_CLOSE(cross_entropy(logits, t, {.label_smoothing = 0.1}), tensor_of({0.50760596}, {}),
                   1e-6, 0);
  // With weight [1, 2, 3]: element loss 0.9 * 3 * 0.40760596 + 0.1 / 3 * (1 * 2.40760596 +
  // 2 * 1.40760596 + 3 * 0.40760596) = 1.31539062; "mean" divides by the target's weight 3.
  const Tensor w = tensor_of({1, 2, 3}, {3});
  KILN_CHECK_CLOSE(
      cross_entropy(logits, t, {.weight = w, .reduction = "sum", .label_smoothing = 0.1}),
      tensor_of({1.31539062}, {}), 1e-6, 0);
  KILN_CHECK_CLOSE(cross_entropy(logits, t, {.weight = w, .label_smoothing = 0.1}),
                   tensor_of({0.43846354}, {}), 1e-6, 0);
  // Probability targets: a one-hot target gives the class-index loss.
  KILN_CHECK_CLOSE(cross_entropy(logits, tensor_of({0, 0, 1}, {1, 3})), tensor_of({0.40760596}, {}),
                   1e-6, 0);
}

TEST_CASE("cross_entropy: class indices / every reduction / weights / ignore_index / smoothing",
          "[loss]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::bf16);
  const std::string reduction = GENERATE("none", "mean", "sum");
  const double ls = GENERATE(0.0, 0.2);
  const bool weighted = GENERATE(false, true);
  // [N, C] and spatial [N, C, H, W]; -100 and 1 are both tried as ignore_index.
  for (const Shape& shape : {Shape{5, 4}, Shape{2, 4, 3, 2}}) {
    const Tensor logits = random(shape, dtype);
    Shape tshape = shape;
    tshape.erase(tshape.begin() + 1);
    const std::vector<double> w =
        weighted ? std::vector<double>{0.5, 2, 1, 3} : std::vector<double>{};
    const Tensor wt = weighted ? tensor_of(w, {4}, dtype) : Tensor();
    const Ncs lp = reference_log_softmax(logits);
    // Tolerance: twice the dtype's (the log-probs are rounded to it before the loss).
    const double tol = testing::tol(dtype) * 4;
    for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
      // Every third target is ignore_index; with ignore_index 1 the targets 1 are ignored too.
      std::vector<int64_t> tv(static_cast<size_t>(numel_of(tshape)));
      for (size_t i = 0; i < tv.size(); ++i)
        tv[i] = i % 3 == 2 ? ignore : static_cast<int64_t>(i * 7 % 4);
      const Tensor t = targets(tv, tshape);
      const Tensor expected = reference_class_loss(lp, t, w, ignore, ls, reduction);
      const CrossEntropyOptions o{
          .weight = wt, .ignore_index = ignore, .reduction = reduction, .label_smoothing = ls};
      for (const Tensor& x :
           {logits, testing::strided_copy(logits), testing::transposed_copy(logits)}) {
        INFO("shape " << shape_str(shape) << " dtype " << name(dtype) << " ignore " << ignore
                      << " strides " << shape_str(x.strides()));
        const Tensor loss = cross_entropy(x, t, o);
        CHECK(loss.dtype() == dtype);
        KILN_CHECK_CLOSE(loss, expected, tol, tol);
        // The same from log-probabilities, through the op taking them.
        KILN_CHECK_CLOSE(cross_entropy_loss(log_softmax(x, 1), t, o), expected, tol, tol);
        if (ls == 0.0) {
          KILN_CHECK_CLOSE(nll_loss(log_softmax(x, 1), t,
                                    {.weight = wt, .ignore_index = ignore, .reduction = reduction}),
                           expected, tol, tol);
        }
      }
    }
  }
}

TEST_CASE("nll_loss: every target ignored", "[loss]") {
  const Tensor lp = random({3, 4});
  const Tensor t = targets({-100, -100, -100}, {3});
  CHECK(std::isnan(testing::at(nll_loss(lp, t), {})));
  CHECK(std::isnan(testing::at(cross_entropy(lp, t, {.label_smoothing = 0.3}), {})));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.reduction = "sum"}), tensor_of({0}, {}));
  KILN_CHECK_EQUAL(nll_loss(lp, t, {.reduction = "none"}), tensor_of({0, 0, 0}, {3}));
  // An empty batch: "mean" is 0 / 0 as well.
  CHECK(std::isnan(testing::at(nll_loss(zeros({0, 4}), targets({}, {0})), {})));
}

TEST_CASE("nll_loss: bad inputs are errors", "[loss]") {
  const Tensor lp = random({2, 3});
  CHECK_THROWS_WITH(nll_loss(lp, targets({0, 3}, {2})),
                    Catch::Contains("nll_loss") && Catch::Contains("target 3"));
  CHECK_THROWS_WITH(nll_loss(lp, targets({-1, 0}, {2}), {.reduction = "sum"}),
                    Catch::Contains("nll_loss") && Catch::Contains("target -1"));
  CHECK_THROWS_WITH(cross_entropy(lp, targets({0, 7}, {2}), {.label_smoothing = 0.1}),
                    Catch::Contains("cross_entropy_loss") && Catch::Contains("target 7"));
  CHECK_THROWS_WITH(nll_loss_backward(tensor_of({1}, {}), lp, targets({5, 0}, {2})),
                    Catch::Contains("nll_loss_backward") && Catch::Contains("target 5"));
  CHECK_THROWS_WITH(nll_loss(lp, targets({0, 1}, {2}), {.reduction = "avg"}),
                    Catch::Contains("nll_loss") && Catch::Contains("\"avg\""));
  CHECK_THROWS_WITH(nll_loss(lp, tensor_of({0, 1}, {2}, DType::i32)),
                    Catch::Contains("nll_loss") && Catch::Contains("i32[2]"));
  CHECK_THROWS_WITH(nll_loss(lp, targets({0, 1, 2}, {3})),
                    Catch::Contains("nll_loss") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(nll_loss(lp, targets({0, 1}, {2}), {.weight = ones({2})}),
                    Catch::Contains("nll_loss") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(nll_loss(tensor_of({0, 1}, {1, 2}, DType::i64), targets({0}, {1})),
                    Catch::Contains("nll_loss") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(cross_entropy(lp, targets({0, 1}, {2}), {.label_smoothing = 1.5}),
                    Catch::Contains("cross_entropy_loss") && Catch::Contains("label_smoothing"));
  CHECK_THROWS_WITH(cross_entropy(tensor_of({1}, {}), targets({0}, {})),
                    Catch::Contains("cross_entropy"));
  CHECK_THROWS_WITH(cross_entropy(lp, random({2, 4})),
                    Catch::Contains("cross_entropy_prob_loss") && Catch::Contains("[2,4]"));
}

TEST_CASE("nll_loss_backward and cross_entropy_loss_backward: finite differences", "[loss]") {
  const std::string reduction = GENERATE("none", "mean", "sum");
  const double ls = GENERATE(0.0, 0.3);
  const Tensor lp = log_softmax(random({2, 3, 2}), 1);
  const Tensor t = targets({0, 2, -100, 1}, {2, 2});
  const Tensor w = tensor_of({0.5, 2, 1.5}, {3});
  const CrossEntropyOptions o{.weight = w, .reduction = reduction, .label_smoothing = ls};
  auto forward = [&](const Tensor& x) { return cross_entropy_loss(x, t, o); };
  const Tensor g = grad_like(forward(lp));
  const Tensor expected = numeric_grad(forward, lp, g);
  // Tolerance 1e-8: the loss is linear in the log-probabilities.
  KILN_CHECK_CLOSE(cross_entropy_loss_backward(g, lp, t, o), expected, 1e-8, 1e-8);
  KILN_CHECK_CLOSE(cross_entropy_loss_backward(g, testing::strided_copy(lp), t, o), expected, 1e-8,
                   1e-8);
  if (ls == 0.0) {
    KILN_CHECK_CLOSE(nll_loss_backward(g, lp, t, {.weight = w, .reduction = reduction}), expected,
                     1e-8, 1e-8);
  }
  // f16: the gradient is rounded to the input's dtype.
  const Tensor g16 = nll_loss_backward(g.to(DType::f16), lp.to(DType::f16), t,
                                       {.weight = w, .reduction = reduction});
  CHECK(g16.dtype() == DType::f16);
  KILN_CHECK_CLOSE(g16, nll_loss_backward(g, lp, t, {.weight = w, .reduction = reduction}),
                   testing::tol(DType::f16), testing::tol(DType::f16));
  CHECK_THROWS_WITH(nll_loss_backward(zeros({3}), lp, t),
                    Catch::Contains("nll_loss_backward") && Catch::Contains("grad_out"));
}

TEST_CASE("cross_entropy: probability targets", "[loss]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::bf16);
  const std::string reduction = GENERATE("none", "mean", "sum");
  const double ls = GENERATE(0.0, 0.25);
  const bool weighted = GENERATE(false, true);
  for (const Shape& shape : {Shape{3, 4}, Shape{2, 4, 3}, Shape{4}}) {
    const Tensor logits = random(shape, dtype);
    const Tensor probs = softmax(random(shape), shape.size() == 1 ? 0 : 1).to(dtype);
    const std::vector<double> w =
        weighted ? std::vector<double>{0.5, 2, 1, 3} : std::vector<double>{};
    const CrossEntropyOptions o{.weight = weighted ? tensor_of(w, {4}) : Tensor(),
                                .reduction = reduction,
                                .label_smoothing = ls};
    Shape none_shape = shape.size() == 1 ? Shape{} : shape;
    if (shape.size() > 1) none_shape.erase(none_shape.begin() + 1);
    const Tensor expected = reference_prob_loss(reference_log_softmax(logits), Ncs(probs), w, ls,
                                                reduction, none_shape);
    const double tol = testing::tol(dtype) * 4;
    for (const Tensor& x : {logits, testing::strided_copy(logits)}) {
      INFO("shape " << shape_str(shape) << " dtype " << name(dtype));
      KILN_CHECK_CLOSE(cross_entropy(x, testing::strided_copy(probs), o), expected, tol, tol);
    }
  }
}

TEST_CASE("cross_entropy_prob_loss_backward: finite differences", "[loss]") {
  const std::string reduction = GENERATE("none", "mean", "sum");
  const Tensor lp = log_softmax(random({2, 3, 2}), 1);
  const Tensor probs = softmax(random({2, 3, 2}), 1);
  const CrossEntropyOptions o{
      .weight = tensor_of({0.5, 2, 1.5}, {3}), .reduction = reduction, .label_smoothing = 0.2};
  auto forward = [&](const Tensor& x) { return cross_entropy_prob_loss(x, probs, o); };
  const Tensor g = grad_like(forward(lp));
  KILN_CHECK_CLOSE(cross_entropy_prob_loss_backward(g, lp, probs, o), numeric_grad(forward, lp, g),
                   1e-8, 1e-8);
}

TEST_CASE("mse_loss: hand values / reductions and broadcasting", "[loss]") {
  const Tensor a = tensor_of({1, 2, 3, 4}, {2, 2});
  const Tensor b = tensor_of({0, 2, 5, 1}, {2, 2});
  KILN_CHECK_EQUAL(mse_loss(a, b, "none"), tensor_of({1, 0, 4, 9}, {2, 2}));
  KILN_CHECK_EQUAL(mse_loss(a, b), tensor_of({3.5}, {}));
  KILN_CHECK_EQUAL(mse_loss(a, b, "sum"), tensor_of({14}, {}));
  // [3, 1] against [1, 4] broadcasts to [3, 4]; "mean" divides by 12.
  const Tensor c = tensor_of({1, 2, 3}, {3, 1});
  const Tensor d = tensor_of({0, 1, 2, 3}, {1, 4});
  std::vector<double> sq;
  double sum = 0;
  for (double x : {1, 2, 3})
    for (double y : {0, 1, 2, 3}) sq.push_back((x - y) * (x - y)), sum += (x - y) * (x - y);
  KILN_CHECK_EQUAL(mse_loss(c, d, "none"), tensor_of(sq, {3, 4}));
  KILN_CHECK_CLOSE(mse_loss(c, d), tensor_of({sum / 12}, {}), 1e-7, 0);
  CHECK(std::isnan(testing::at(mse_loss(zeros({0}), zeros({0})), {})));
}

TEST_CASE("mse_loss: dtypes and strided inputs", "[loss]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::bf16);
  const std::string reduction = GENERATE("none", "mean", "sum");
  const Tensor a = random({4, 5}, dtype), b = random({4, 5}, dtype);
  std::vector<double> va = testing::values(a), vb = testing::values(b), sq;
  double sum = 0;
  for (size_t i = 0; i < va.size(); ++i)
    sq.push_back((va[i] - vb[i]) * (va[i] - vb[i])), sum += sq.back();
  const Tensor expected = reduction == "none"  ? tensor_of(sq, {4, 5}, DType::f64)
                          : reduction == "sum" ? tensor_of({sum}, {}, DType::f64)
                                               : tensor_of({sum / 20}, {}, DType::f64);
  const double tol = testing::tol(dtype) * 2;
  KILN_CHECK_CLOSE(mse_loss(a, b, reduction), expected, tol, tol);
  KILN_CHECK_CLOSE(mse_loss(testing::strided_copy(a), testing::transposed_copy(b), reduction),
                   expected, tol, tol);
  CHECK(mse_loss(a, b, reduction).dtype() == dtype);
  // Mixed dtypes promote as in PyTorch: anything with f64 computes in f64.
  CHECK(mse_loss(a, b.to(DType::f64), reduction).dtype() == DType::f64);
}

TEST_CASE("mse_loss_backward: finite differences", "[loss]") {
  const std::string reduction = GENERATE("none", "mean", "sum");
  const Tensor a = random({3, 1}), b = random({1, 4});
  const Tensor g = grad_like(mse_loss(a, b, reduction));
  // The gradient is in the broadcast shape; compare against d/da of the expanded input.
  const Tensor a_full = a.expand({3, 4}).contiguous();
  KILN_CHECK_CLOSE(
      mse_loss_backward(g, a, b, reduction),
      numeric_grad([&](const Tensor& x) { return mse_loss(x, b, reduction); }, a_full, g), 1e-7,
      1e-8);
}

TEST_CASE("mse_loss: bad inputs are errors", "[loss]") {
  CHECK_THROWS_WITH(mse_loss(zeros({2, 3}), zeros({4})),
                    Catch::Contains("mse_loss") && Catch::Contains("[2,3]"));
  CHECK_THROWS_WITH(mse_loss(zeros({2}), zeros({2}), "mena"),
                    Catch::Contains("mse_loss") && Catch::Contains("\"mena\""));
  CHECK_THROWS_WITH(mse_loss(zeros({2}, {.dtype = DType::i64}), zeros({2}, {.dtype = DType::i64})),
                    Catch::Contains("mse_loss") && Catch::Contains("i64[2]"));
  CHECK_THROWS_WITH(mse_loss_backward(zeros({2}), zeros({2}), zeros({2})),
                    Catch::Contains("mse_loss_backward") && Catch::Contains("grad_out"));
}
