// Batch and layer normalization against naive f64 loops over indices, and their backward ops
// against central finite differences in f64. Tolerances: outputs testing::tol(dtype) (f64:
// 1e-12), directional derivatives 1e-6 relative (h = 1e-5; the difference quotient's own
// error is about 1e-10).
#include <cmath>
#include <functional>

#include "core/ops/norm.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct RefBatchNorm {
  Tensor output, mean, invstd, var_unbiased;
};

// Per-channel statistics over every index but dim 1 (or the given ones), then the affine map.
RefBatchNorm ref_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& use_mean, const Tensor& use_var, double eps) {
  const int64_t C = x.size(1);
  std::vector<double> sum(C, 0.0), sq(C, 0.0), count(C, 0.0);
  for_each_index(x.shape(), [&](const std::vector<int64_t>& i) {
    sum[i[1]] += at(x, i);
    count[i[1]] += 1;
  });
  std::vector<double> mean(C), var(C), unbiased(C), invstd(C);
  for (int64_t c = 0; c < C; ++c) mean[c] = sum[c] / count[c];
  for_each_index(x.shape(), [&](const std::vector<int64_t>& i) {
    const double d = at(x, i) - mean[i[1]];
    sq[i[1]] += d * d;
  });
  for (int64_t c = 0; c < C; ++c) {
    var[c] = sq[c] / count[c];
    unbiased[c] = sq[c] / (count[c] - 1);
    if (use_mean.defined()) {
      mean[c] = at(use_mean, {c});
      var[c] = at(use_var, {c});
    }
    invstd[c] = 1.0 / std::sqrt(var[c] + eps);
  }
  std::vector<double> out;
  for_each_index(x.shape(), [&](const std::vector<int64_t>& i) {
    const int64_t c = i[1];
    const double w = weight.defined() ? at(weight, {c}) : 1.0;
    const double b = bias.defined() ? at(bias, {c}) : 0.0;
    out.push_back((at(x, i) - mean[c]) * invstd[c] * w + b);
  });
  return {tensor_of(out, x.shape(), DType::f64), tensor_of(mean, {C}, DType::f64),
          tensor_of(invstd, {C}, DType::f64), tensor_of(unbiased, {C}, DType::f64)};
}

// Normalizes each row of the trailing `k` elements.
Tensor ref_layer_norm(const Tensor& x, int64_t k, const Tensor& weight, const Tensor& bias,
                      double eps, std::vector<double>* means = nullptr,
                      std::vector<double>* rstds = nullptr) {
  const std::vector<double> v = values(x);
  const Tensor wf = weight.defined() ? weight.reshape({k}) : Tensor();
  const Tensor bf = bias.defined() ? bias.reshape({k}) : Tensor();
  std::vector<double> out;
  for (size_t r = 0; r * k < v.size(); ++r) {
    double m = 0, var = 0;
    for (int64_t i = 0; i < k; ++i) m += v[r * k + i];
    m /= static_cast<double>(k);
    for (int64_t i = 0; i < k; ++i) var += (v[r * k + i] - m) * (v[r * k + i] - m);
    const double rs = 1.0 / std::sqrt(var / static_cast<double>(k) + eps);
    if (means) means->push_back(m);
    if (rstds) rstds->push_back(rs);
    for (int64_t i = 0; i < k; ++i) {
      const double w = wf.defined() ? at(wf, {i}) : 1.0, b = bf.defined() ? at(bf, {i}) : 0.0;
      out.push_back((v[r * k + i] - m) * rs * w + b);
    }
  }
  return tensor_of(out, x.shape(), DType::f64);
}

double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  REQUIRE(va.size() == vb.size());
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

// Checks d/dh f(h) at 0 by a central difference against `analytic`.
void check_directional(const std::function<double(double)>& f, double analytic, const char* what) {
  const double h = 1e-5;
  const double numeric = (f(h) - f(-h)) / (2 * h);
  INFO(what << ": numeric " << numeric << ", analytic " << analytic);
  CHECK(std::fabs(numeric - analytic) <= 1e-6 * std::fabs(analytic) + 1e-9);
}

Tensor rand64(Shape shape) { return randn(std::move(shape), {.dtype = DType::f64}); }

}  // namespace

TEST_CASE("batch_norm in training matches a naive loop", "[norm]") {
  for (Shape shape : {Shape{6, 3}, Shape{4, 3, 5}, Shape{2, 3, 4, 5}}) {
    for (DType dtype : kFloatDTypes) {
      for (bool affine : {true, false}) {
        INFO(shape_str(shape) << " " << name(dtype) << " affine=" << affine);
        const Tensor x = (randn(shape) * 2.0 + 3.0).to(dtype);
        const Tensor w = affine ? randn({3}).to(dtype) : Tensor();
        const Tensor b = affine ? randn({3}).to(dtype) : Tensor();
        const RefBatchNorm ref = ref_batch_norm(x, w, b, {}, {}, 1e-5);
        const double t = tol(dtype) * 4;
        for (const Tensor& input : {x, strided_copy(x), transposed_copy(x)}) {
          BatchNormResult r = batch_norm_with_stats(input, w, b, {}, {}, true, 0.1, 1e-5);
          CHECK(r.output.dtype() == dtype);
          CHECK(r.save_mean.dtype() == (dtype == DType::f64 ? DType::f64 : DType::f32));
          KILN_CHECK_CLOSE(r.output, ref.output, t, t);
          KILN_CHECK_CLOSE(r.save_mean, ref.mean, t, t);
          KILN_CHECK_CLOSE(r.save_invstd, ref.invstd, t, t);
        }
      }
    }
  }
}

TEST_CASE("batch_norm in training updates the running statistics in place", "[norm]") {
  const Tensor x = rand64({4, 3, 2, 3}) * 1.5 + 0.5;
  const double momentum = 0.25;
  const RefBatchNorm ref = ref_batch_norm(x, {}, {}, {}, {}, 1e-5);
  // Strided f32 running statistics: written through their strides, in their dtype.
  Tensor mean_buffer = from_vector<float>({1, -9, 2, -9, 3, -9});
  Tensor running_mean = mean_buffer.slice(0, 0, 6, 2);
  Tensor running_var = from_vector<float>({0.5, 1, 2});
  const Tensor mean0 = running_mean.clone(), var0 = running_var.clone();
  const uint64_t v_mean = running_mean.storage()->version, v_var = running_var.storage()->version;
  Tensor y = batch_norm(x, {}, {}, running_mean, running_var, true, momentum);
  KILN_CHECK_CLOSE(y, ref.output, 1e-12, 1e-12);
  KILN_CHECK_CLOSE(running_mean, mean0 * (1 - momentum) + ref.mean * momentum, 1e-6, 1e-6);
  KILN_CHECK_CLOSE(running_var, var0 * (1 - momentum) + ref.var_unbiased * momentum, 1e-6, 1e-6);
  KILN_CHECK_EQUAL(mean_buffer.slice(0, 1, 6, 2), full({3}, -9.0));
  CHECK(running_mean.storage()->version > v_mean);
  CHECK(running_var.storage()->version > v_var);
}

TEST_CASE("batch_norm in eval uses the running statistics", "[norm]") {
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    const Tensor x = randn({3, 4, 5}).to(dtype);
    const Tensor w = randn({4}).to(dtype), b = randn({4}).to(dtype);
    const Tensor running_mean = randn({4}), running_var = rand({4}) + 0.5;
    const Tensor mean0 = running_mean.clone(), var0 = running_var.clone();
    const RefBatchNorm ref = ref_batch_norm(x, w, b, running_mean, running_var, 1e-3);
    BatchNormResult r = batch_norm_with_stats(transposed_copy(x), w, b, running_mean, running_var,
                                              false, 0.1, 1e-3);
    const double t = tol(dtype) * 4;
    KILN_CHECK_CLOSE(r.output, ref.output, t, t);
    // The saved statistics are the ones used, so batch_norm_backward works in eval too.
    KILN_CHECK_CLOSE(r.save_mean, running_mean, 0, 0);
    KILN_CHECK_CLOSE(r.save_invstd, ref.invstd, 1e-6, 1e-6);
    KILN_CHECK_EQUAL(running_mean, mean0);
    KILN_CHECK_EQUAL(running_var, var0);
  }
}

TEST_CASE("batch_norm_backward matches finite differences", "[norm]") {
  for (bool training : {true, false}) {
    for (Shape shape : {Shape{5, 3}, Shape{2, 3, 4}, Shape{2, 3, 2, 3}}) {
      for (bool affine : {true, false}) {
        INFO(shape_str(shape) << " training=" << training << " affine=" << affine);
        const Tensor x = rand64(shape) * 2.0 + 1.0, g = rand64(shape);
        const Tensor w = affine ? rand64({3}) : Tensor(), b = affine ? rand64({3}) : Tensor();
        const Tensor running_mean = rand64({3}), running_var = rand64({3}) * 0.1 + 1.0;
        // Eval mode must not change the running statistics: the loss stays a function.
        auto loss = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
          return dot(batch_norm(xi, wi, bi, training ? Tensor() : running_mean,
                                training ? Tensor() : running_var, training, 0.1, 1e-5),
                     g);
        };
        BatchNormResult fwd =
            batch_norm_with_stats(x, w, b, training ? Tensor() : running_mean,
                                  training ? Tensor() : running_var, training, 0.1, 1e-5);
        NormGrads grads = batch_norm_backward(strided_copy(g), x, w, fwd.save_mean, fwd.save_invstd,
                                              training, 1e-5);
        CHECK(grads.grad_input.shape() == x.shape());
        CHECK(grads.grad_weight.shape() == Shape{3});
        const Tensor v = rand64(shape);
        check_directional([&](double h) { return loss(x + v * h, w, b); }, dot(grads.grad_input, v),
                          "input");
        if (affine) {
          const Tensor u = rand64({3});
          check_directional([&](double h) { return loss(x, w + u * h, b); },
                            dot(grads.grad_weight, u), "weight");
          check_directional([&](double h) { return loss(x, w, b + u * h); },
                            dot(grads.grad_bias, u), "bias");
        }
      }
    }
  }
}

TEST_CASE("batch_norm_backward in 16-bit floats is close to f64", "[norm]") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    INFO(name(dtype));
    const Tensor x = randn({4, 3, 5}).to(dtype), g = randn({4, 3, 5}).to(dtype);
    const Tensor w = randn({3}).to(dtype);
    BatchNormResult fwd = batch_norm_with_stats(x, w, {}, {}, {}, true);
    NormGrads lo = batch_norm_backward(g, x, w, fwd.save_mean, fwd.save_invstd, true);
    NormGrads hi =
        batch_norm_backward(g.to(DType::f64), x.to(DType::f64), w.to(DType::f64),
                            fwd.save_mean.to(DType::f64), fwd.save_invstd.to(DType::f64), true);
    CHECK(lo.grad_input.dtype() == dtype);
    CHECK(lo.grad_weight.dtype() == dtype);
    const double t = tol(dtype) * 8;
    KILN_CHECK_CLOSE(lo.grad_input, hi.grad_input, t, t);
    KILN_CHECK_CLOSE(lo.grad_weight, hi.grad_weight, t, t * 10);
    KILN_CHECK_CLOSE(lo.grad_bias, hi.grad_bias, t, t * 10);
  }
}

TEST_CASE("layer_norm matches a naive loop", "[norm]") {
  for (DType dtype : kFloatDTypes) {
    for (std::vector<int64_t> ns : {std::vector<int64_t>{5}, {4, 5}, {3, 4, 5}}) {
      for (int affine = 0; affine < 4; ++affine) {
        INFO(name(dtype) << " normalized_shape=" << shape_str(ns) << " affine=" << affine);
        const Tensor x = (randn({2, 3, 4, 5}) * 3.0 - 1.0).to(dtype);
        const Tensor w = affine & 1 ? randn(ns).to(dtype) : Tensor();
        const Tensor b = affine & 2 ? randn(ns).to(dtype) : Tensor();
        std::vector<double> means, rstds;
        const Tensor expected = ref_layer_norm(x, numel_of(ns), w, b, 1e-5, &means, &rstds);
        Shape stats_shape = x.shape();
        for (size_t d = 4 - ns.size(); d < 4; ++d) stats_shape[d] = 1;
        const double t = tol(dtype) * 4;
        for (const Tensor& input : {x, strided_copy(x), transposed_copy(x)}) {
          LayerNormResult r = layer_norm_with_stats(input, ns, w, b, 1e-5);
          CHECK(r.output.dtype() == dtype);
          KILN_CHECK_CLOSE(r.output, expected, t, t);
          CHECK(r.mean.shape() == stats_shape);
          KILN_CHECK_CLOSE(r.mean.flatten(), tensor_of(means, {int64_t(means.size())}, DType::f64),
                           t, t);
          KILN_CHECK_CLOSE(r.rstd.flatten(), tensor_of(rstds, {int64_t(rstds.size())}, DType::f64),
                           t, t);
        }
      }
    }
  }
}

TEST_CASE("layer_norm_backward matches finite differences", "[norm]") {
  for (std::vector<int64_t> ns : {std::vector<int64_t>{6}, {3, 4}}) {
    for (bool affine : {true, false}) {
      INFO("normalized_shape=" << shape_str(ns) << " affine=" << affine);
      Shape shape{2, 3};
      shape.insert(shape.end(), ns.begin(), ns.end());
      const Tensor x = rand64(shape) * 2.0 + 0.5, g = rand64(shape);
      const Tensor w = affine ? rand64(ns) : Tensor(), b = affine ? rand64(ns) : Tensor();
      auto loss = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
        return dot(layer_norm(xi, ns, wi, bi, 1e-5), g);
      };
      LayerNormResult fwd = layer_norm_with_stats(x, ns, w, b, 1e-5);
      NormGrads grads =
          layer_norm_backward(transposed_copy(g), strided_copy(x), ns, fwd.mean, fwd.rstd, w);
      CHECK(grads.grad_weight.shape() == Shape(ns.begin(), ns.end()));
      const Tensor v = rand64(shape);
      check_directional([&](double h) { return loss(x + v * h, w, b); }, dot(grads.grad_input, v),
                        "input");
      if (affine) {
        const Tensor u = rand64(ns);
        check_directional([&](double h) { return loss(x, w + u * h, b); },
                          dot(grads.grad_weight, u), "weight");
        check_directional([&](double h) { return loss(x, w, b + u * h); }, dot(grads.grad_bias, u),
                          "bias");
      } else {
        // Without a weight, grad_weight is still the gradient a unit weight would get.
        const Tensor ones_w = ones(ns, {.dtype = DType::f64}), u = rand64(ns);
        check_directional([&](double h) { return loss(x, ones_w + u * h, Tensor()); },
                          dot(grads.grad_weight, u), "weight");
      }
    }
  }
}

TEST_CASE("layer_norm_backward in 16-bit floats is close to f64", "[norm]") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    INFO(name(dtype));
    const Tensor x = randn({6, 16}).to(dtype), g = randn({6, 16}).to(dtype);
    const Tensor w = randn({16}).to(dtype);
    LayerNormResult fwd = layer_norm_with_stats(x, {16}, w);
    NormGrads lo = layer_norm_backward(g, x, {16}, fwd.mean, fwd.rstd, w);
    NormGrads hi =
        layer_norm_backward(g.to(DType::f64), x.to(DType::f64), {16}, fwd.mean.to(DType::f64),
                            fwd.rstd.to(DType::f64), w.to(DType::f64));
    CHECK(lo.grad_input.dtype() == dtype);
    const double t = tol(dtype) * 8;
    KILN_CHECK_CLOSE(lo.grad_input, hi.grad_input, t, t);
    KILN_CHECK_CLOSE(lo.grad_weight, hi.grad_weight, t, t * 4);
    KILN_CHECK_CLOSE(lo.grad_bias, hi.grad_bias, t, t * 4);
  }
}

TEST_CASE("normalization rejects bad input", "[norm]") {
  using Catch::Contains;
  const Tensor x = randn({4, 3, 5});
  const Tensor rm = zeros({3}), rv = ones({3});
  CHECK_THROWS_WITH(batch_norm(x, randn({4}), {}, {}, {}, true),
                    Contains("batch_norm") && Contains("weight") && Contains("[3]"));
  CHECK_THROWS_WITH(batch_norm(x, {}, randn({2}), {}, {}, true),
                    Contains("batch_norm") && Contains("bias"));
  CHECK_THROWS_WITH(batch_norm(x, {}, {}, zeros({4}), ones({4}), true),
                    Contains("batch_norm") && Contains("running_mean"));
  CHECK_THROWS_WITH(batch_norm(randn({5}), {}, {}, {}, {}, true),
                    Contains("batch_norm") && Contains("f32[5]"));
  CHECK_THROWS_WITH(batch_norm(x, {}, {}, {}, {}, false),
                    Contains("batch_norm") && Contains("eval"));
  CHECK_THROWS_WITH(batch_norm(x, {}, {}, rm, {}, true),
                    Contains("batch_norm") && Contains("neither"));
  CHECK_THROWS_WITH(batch_norm(randn({1, 3}), {}, {}, {}, {}, true),
                    Contains("batch_norm") && Contains("more than 1 value"));
  CHECK_THROWS_WITH(batch_norm(zeros({4, 3}, {.dtype = DType::i64}), {}, {}, rm, rv, false),
                    Contains("batch_norm") && Contains("floating"));
  CHECK_NOTHROW(batch_norm(randn({1, 3}), {}, {}, rm, rv, false));
  BatchNormResult fwd = batch_norm_with_stats(x, {}, {}, {}, {}, true);
  CHECK_THROWS_WITH(
      batch_norm_backward(randn({4, 3, 4}), x, {}, fwd.save_mean, fwd.save_invstd, true),
      Contains("batch_norm_backward") && Contains("f32[4,3,4]"));
  CHECK_THROWS_WITH(batch_norm_backward(x, x, {}, randn({2}), fwd.save_invstd, true),
                    Contains("batch_norm_backward") && Contains("save_mean"));

  CHECK_THROWS_WITH(layer_norm(x, {4}), Contains("layer_norm") &&
                                            Contains("normalized_shape [4]") &&
                                            Contains("f32[4,3,5]"));
  CHECK_THROWS_WITH(layer_norm(x, {2, 4, 3, 5}), Contains("layer_norm"));
  CHECK_THROWS_WITH(layer_norm(x, {}), Contains("layer_norm") && Contains("empty"));
  CHECK_THROWS_WITH(layer_norm(x, {3, 5}, randn({5})),
                    Contains("layer_norm") && Contains("weight"));
  CHECK_THROWS_WITH(layer_norm(x, {5}, {}, randn({3})), Contains("layer_norm") && Contains("bias"));
  CHECK_THROWS_WITH(layer_norm(zeros({2, 5}, {.dtype = DType::i32}), {5}),
                    Contains("layer_norm") && Contains("floating"));
  LayerNormResult ln = layer_norm_with_stats(x, {5});
  CHECK_THROWS_WITH(layer_norm_backward(x, x, {5}, randn({3}), ln.rstd),
                    Contains("layer_norm_backward") && Contains("mean"));
  CHECK_THROWS_WITH(layer_norm_backward(x, x, {3, 5}, ln.mean, ln.rstd),
                    Contains("layer_norm_backward"));
}

TEST_CASE("normalization splits many channels and rows among threads", "[norm]") {
  // Enough channels (batch norm) and rows (layer norm) that parallel_for uses every thread.
  const Tensor x = rand64({3, 20000});
  const RefBatchNorm ref = ref_batch_norm(x, {}, {}, {}, {}, 1e-5);
  BatchNormResult bn = batch_norm_with_stats(x, {}, {}, {}, {}, true);
  KILN_CHECK_CLOSE(bn.output, ref.output, 1e-12, 1e-12);
  KILN_CHECK_CLOSE(bn.save_invstd, ref.invstd, 1e-12, 1e-12);

  // layer_norm_backward's grad_weight sums partial sums of every thread: compare with the
  // sum over slices small enough for one thread.
  const Tensor y = rand64({6000, 8}), g = rand64({6000, 8}), w = rand64({8});
  LayerNormResult fwd = layer_norm_with_stats(y, {8}, w);
  KILN_CHECK_CLOSE(fwd.output, ref_layer_norm(y, 8, w, {}, 1e-5), 1e-12, 1e-12);
  NormGrads all = layer_norm_backward(g, y, {8}, fwd.mean, fwd.rstd, w);
  Tensor grad_weight = zeros({8}, {.dtype = DType::f64});
  for (int64_t start = 0; start < 6000; start += 1000) {
    NormGrads part =
        layer_norm_backward(g.narrow(0, start, 1000), y.narrow(0, start, 1000), {8},
                            fwd.mean.narrow(0, start, 1000), fwd.rstd.narrow(0, start, 1000), w);
    KILN_CHECK_CLOSE(all.grad_input.narrow(0, start, 1000), part.grad_input, 1e-12, 1e-12);
    grad_weight.add_(part.grad_weight);
  }
  KILN_CHECK_CLOSE(all.grad_weight, grad_weight, 1e-10, 1e-10);
}
