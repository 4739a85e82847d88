// Pooling ops against naive f64 loops over indices. Tolerances: max pooling is exact in
// every dtype (it only selects); averages use testing::tol(dtype); the adjoint identities
// of the backward ops hold to 1e-12 relative in f64.
#include <cmath>
#include <optional>

#include "core/ops/pool.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Window {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode;
};

int64_t pair_at(const std::vector<int64_t>& v, int d, int64_t fallback) {
  if (v.empty()) return fallback;
  return v.size() == 1 ? v[0] : v[static_cast<size_t>(d)];
}

// The pooled size, written from PyTorch's documented formula with floating division.
int64_t ref_out_size(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil_mode) {
  const double span = static_cast<double>(in + 2 * p - d * (k - 1) - 1) / static_cast<double>(s);
  int64_t out = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct Geometry {
  int64_t k[2], s[2], p[2], d[2], out[2];
};

Geometry geometry(const Window& w, int64_t in_h, int64_t in_w) {
  Geometry g;
  const int64_t in[2] = {in_h, in_w};
  for (int d = 0; d < 2; ++d) {
    g.k[d] = pair_at(w.kernel, d, 0);
    g.s[d] = pair_at(w.stride, d, g.k[d]);
    g.p[d] = pair_at(w.padding, d, 0);
    g.d[d] = pair_at(w.dilation, d, 1);
    g.out[d] = ref_out_size(in[d], g.k[d], g.p[d], g.s[d], g.d[d], w.ceil_mode);
  }
  return g;
}

// x viewed as 4-d (an unbatched input gets a batch of one).
Tensor as_4d(const Tensor& x) { return x.dim() == 3 ? x.unsqueeze(0) : x; }

Shape pooled_shape_of(const Tensor& x, int64_t oh, int64_t ow) {
  Shape s = x.shape();
  s[s.size() - 2] = oh;
  s[s.size() - 1] = ow;
  return s;
}

std::pair<Tensor, Tensor> ref_max_pool(const Tensor& x, const Window& w) {
  const Tensor x4 = as_4d(x);
  const int64_t N = x4.size(0), C = x4.size(1), H = x4.size(2), W = x4.size(3);
  const Geometry g = geometry(w, H, W);
  std::vector<double> vals;
  std::vector<int64_t> idx;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < g.out[0]; ++oh)
        for (int64_t ow = 0; ow < g.out[1]; ++ow) {
          double best = -INFINITY;
          int64_t best_i = -1;
          for (int64_t i = 0; i < g.k[0]; ++i)
            for (int64_t j = 0; j < g.k[1]; ++j) {
              const int64_t h = oh * g.s[0] - g.p[0] + i * g.d[0];
              const int64_t ww = ow * g.s[1] - g.p[1] + j * g.d[1];
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              const double v = at(x4, {n, c, h, ww});
              if (best_i < 0 || v > best) {
                best = v;
                best_i = h * W + ww;
              }
            }
          vals.push_back(best);
          idx.push_back(best_i);
        }
  const Shape shape = pooled_shape_of(x, g.out[0], g.out[1]);
  return {tensor_of(vals, shape, DType::f64), from_vector<int64_t>(idx, shape)};
}

Tensor ref_avg_pool(const Tensor& x, const Window& w, bool count_include_pad,
                    std::optional<int64_t> divisor) {
  const Tensor x4 = as_4d(x);
  const int64_t N = x4.size(0), C = x4.size(1), H = x4.size(2), W = x4.size(3);
  const Geometry g = geometry(w, H, W);
  std::vector<double> vals;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < g.out[0]; ++oh)
        for (int64_t ow = 0; ow < g.out[1]; ++ow) {
          double sum = 0;
          int64_t valid = 0, padded = 0;
          for (int64_t i = 0; i < g.k[0]; ++i)
            for (int64_t j = 0; j < g.k[1]; ++j) {
              const int64_t h = oh * g.s[0] - g.p[0] + i, ww = ow * g.s[1] - g.p[1] + j;
              // Padding counts only up to its far edge; ceil mode may reach past it.
              if (h < H + g.p[0] && ww < W + g.p[1]) ++padded;
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              sum += at(x4, {n, c, h, ww});
              ++valid;
            }
          const int64_t div = divisor ? *divisor : count_include_pad ? padded : valid;
          vals.push_back(valid == 0 ? 0.0 : sum / static_cast<double>(div));
        }
  return tensor_of(vals, pooled_shape_of(x, g.out[0], g.out[1]), DType::f64);
}

Tensor ref_adaptive_avg_pool(const Tensor& x, int64_t oh_size, int64_t ow_size) {
  const Tensor x4 = as_4d(x);
  const int64_t N = x4.size(0), C = x4.size(1), H = x4.size(2), W = x4.size(3);
  std::vector<double> vals;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < oh_size; ++oh)
        for (int64_t ow = 0; ow < ow_size; ++ow) {
          const auto h0 = static_cast<int64_t>(std::floor(double(oh * H) / double(oh_size)));
          const auto h1 = static_cast<int64_t>(std::ceil(double((oh + 1) * H) / double(oh_size)));
          const auto w0 = static_cast<int64_t>(std::floor(double(ow * W) / double(ow_size)));
          const auto w1 = static_cast<int64_t>(std::ceil(double((ow + 1) * W) / double(ow_size)));
          double sum = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) sum += at(x4, {n, c, h, w});
          vals.push_back(sum / static_cast<double>((h1 - h0) * (w1 - w0)));
        }
  return tensor_of(vals, pooled_shape_of(x, oh_size, ow_size), DType::f64);
}

double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  REQUIRE(va.size() == vb.size());
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

// Every combination of the window options on small sizes.
std::vector<Window> windows(bool with_dilation) {
  std::vector<Window> out;
  for (const std::vector<int64_t>& k : {std::vector<int64_t>{2}, {3, 2}, {3}})
    for (const std::vector<int64_t>& s : {std::vector<int64_t>{}, {2}, {1, 2}})
      for (const std::vector<int64_t>& p : {std::vector<int64_t>{0}, {1}, {1, 0}})
        for (const std::vector<int64_t>& d : {std::vector<int64_t>{1}, {2, 1}})
          for (bool ceil_mode : {false, true}) {
            if (!with_dilation && d[0] != 1) continue;
            out.push_back({k, s, p, d, ceil_mode});
          }
  return out;
}

std::string window_str(const Window& w) {
  return fmt::format("kernel={} stride={} padding={} dilation={} ceil_mode={}", shape_str(w.kernel),
                     shape_str(w.stride), shape_str(w.padding), shape_str(w.dilation), w.ceil_mode);
}

// The layouts every op is tried on: contiguous, strided and transposed.
std::vector<Tensor> layouts(const Tensor& x) { return {x, strided_copy(x), transposed_copy(x)}; }

}  // namespace

TEST_CASE("max_pool2d matches a naive loop for every option", "[pool]") {
  const Tensor x = randn({2, 3, 7, 6}, {.dtype = DType::f64});
  for (const Window& w : windows(true)) {
    INFO(window_str(w));
    auto [values_ref, indices_ref] = ref_max_pool(x, w);
    for (const Tensor& input : layouts(x)) {
      MaxPool2dResult r =
          max_pool2d_with_indices(input, w.kernel, w.stride, w.padding, w.dilation, w.ceil_mode);
      KILN_CHECK_EQUAL(r.values, values_ref);
      KILN_CHECK_EQUAL(r.indices, indices_ref);
      CHECK(r.indices.dtype() == DType::i64);
    }
  }
}

TEST_CASE("max_pool2d in every floating dtype / unbatched / and with -inf and NaN", "[pool]") {
  const Window w{{3}, {2}, {1}, {1}, true};
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    const Tensor x = randn({3, 5, 6}).to(dtype);  // unbatched CHW
    auto [values_ref, indices_ref] = ref_max_pool(x, w);
    MaxPool2dResult r = max_pool2d_with_indices(strided_copy(x), {3}, {2}, {1}, {1}, true);
    CHECK(r.values.dtype() == dtype);
    KILN_CHECK_EQUAL(r.values, values_ref);
    KILN_CHECK_EQUAL(r.indices, indices_ref);
    KILN_CHECK_EQUAL(max_pool2d(x, {3}, {2}, {1}, {1}, true), values_ref);
  }
  // As PyTorch: an all -inf window points at its first element; a NaN wins.
  Tensor x = full({1, 1, 2, 4}, -INFINITY);
  x.select(3, 3).select(2, 1).fill_(NAN);
  MaxPool2dResult r = max_pool2d_with_indices(x, {2});
  KILN_CHECK_EQUAL(r.indices, from_vector<int64_t>({0, 7}, {1, 1, 1, 2}));
  CHECK(std::isinf(at(r.values, {0, 0, 0, 0})));
  CHECK(std::isnan(at(r.values, {0, 0, 0, 1})));
}

TEST_CASE("avg_pool2d matches a naive loop for every option", "[pool]") {
  const Tensor x = randn({2, 3, 7, 6}, {.dtype = DType::f64});
  for (const Window& w : windows(false)) {
    for (bool include_pad : {true, false}) {
      for (std::optional<int64_t> divisor : {std::optional<int64_t>{}, std::optional<int64_t>{5}}) {
        INFO(window_str(w) << " count_include_pad=" << include_pad
                           << " divisor_override=" << divisor.value_or(0));
        const Tensor expected = ref_avg_pool(x, w, include_pad, divisor);
        for (const Tensor& input : layouts(x)) {
          KILN_CHECK_CLOSE(
              avg_pool2d(input, w.kernel, w.stride, w.padding, w.ceil_mode, include_pad, divisor),
              expected, 1e-12, 1e-12);
        }
      }
    }
  }
}

TEST_CASE("avg_pool2d and adaptive_avg_pool2d in every floating dtype", "[pool]") {
  const Window w{{3, 2}, {2, 1}, {1, 1}, {1}, true};
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    const Tensor x = randn({2, 3, 5, 6}).to(dtype);
    const double t = tol(dtype);
    Tensor y = avg_pool2d(strided_copy(x), {3, 2}, {2, 1}, {1, 1}, true, false);
    CHECK(y.dtype() == dtype);
    KILN_CHECK_CLOSE(y, ref_avg_pool(x, w, false, std::nullopt), t, t);
    Tensor a = adaptive_avg_pool2d(transposed_copy(x), {3, 4});
    CHECK(a.dtype() == dtype);
    KILN_CHECK_CLOSE(a, ref_adaptive_avg_pool(x, 3, 4), t, t);
    KILN_CHECK_CLOSE(adaptive_avg_pool2d(x[0], {2}), ref_adaptive_avg_pool(x[0], 2, 2), t, t);
  }
}

TEST_CASE("adaptive_avg_pool2d matches a naive loop for shrinking and growing sizes", "[pool]") {
  const Tensor x = randn({2, 3, 7, 5}, {.dtype = DType::f64});
  for (auto [oh, ow] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 2}, {7, 5}, {4, 5}, {9, 8}, {2, 7}}) {
    INFO("output " << oh << "x" << ow);
    for (const Tensor& input : layouts(x))
      KILN_CHECK_CLOSE(adaptive_avg_pool2d(input, {oh, ow}), ref_adaptive_avg_pool(x, oh, ow),
                       1e-12, 1e-12);
  }
}

TEST_CASE("avg_pool2d_backward is the adjoint of avg_pool2d", "[pool]") {
  // <avg_pool2d(x), g> == <x, avg_pool2d_backward(g)> for every option.
  const Tensor x = randn({2, 2, 7, 6}, {.dtype = DType::f64});
  for (const Window& w : windows(false)) {
    for (bool include_pad : {true, false}) {
      for (std::optional<int64_t> divisor : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
        INFO(window_str(w) << " count_include_pad=" << include_pad
                           << " divisor_override=" << divisor.value_or(0));
        const Tensor y =
            avg_pool2d(x, w.kernel, w.stride, w.padding, w.ceil_mode, include_pad, divisor);
        const Tensor g = randn(y.shape(), {.dtype = DType::f64});
        const Tensor gx = avg_pool2d_backward(strided_copy(g), x.shape(), w.kernel, w.stride,
                                              w.padding, w.ceil_mode, include_pad, divisor);
        CHECK(gx.shape() == x.shape());
        const double lhs = dot(y, g), rhs = dot(x, gx);
        CHECK(std::fabs(lhs - rhs) <= 1e-12 * (1 + std::fabs(lhs)));
      }
    }
  }
}

TEST_CASE("adaptive_avg_pool2d_backward is the adjoint of adaptive_avg_pool2d", "[pool]") {
  const Tensor x = randn({2, 3, 7, 5}, {.dtype = DType::f64});
  for (auto [oh, ow] : {std::pair<int64_t, int64_t>{1, 1}, {3, 2}, {4, 5}, {9, 8}}) {
    INFO("output " << oh << "x" << ow);
    const Tensor y = adaptive_avg_pool2d(x, {oh, ow});
    const Tensor g = randn(y.shape(), {.dtype = DType::f64});
    const Tensor gx = adaptive_avg_pool2d_backward(transposed_copy(g), x.shape());
    CHECK(gx.shape() == x.shape());
    const double lhs = dot(y, g), rhs = dot(x, gx);
    CHECK(std::fabs(lhs - rhs) <= 1e-12 * (1 + std::fabs(lhs)));
  }
}

TEST_CASE("max_pool2d_backward scatters grad_out to the indices", "[pool]") {
  const Tensor x = randn({2, 3, 6, 5}, {.dtype = DType::f64});
  for (const Window& w : windows(true)) {
    INFO(window_str(w));
    MaxPool2dResult r =
        max_pool2d_with_indices(x, w.kernel, w.stride, w.padding, w.dilation, w.ceil_mode);
    const Tensor g = randn(r.values.shape(), {.dtype = DType::f64});
    // Overlapping windows may pick one element twice: the reference sums.
    Tensor expected = zeros(x.shape(), {.dtype = DType::f64});
    const int64_t W = x.size(3);
    for_each_index(g.shape(), [&](const std::vector<int64_t>& i) {
      const auto flat = static_cast<int64_t>(at(r.indices, i));
      Tensor e = expected.select(0, i[0]).select(0, i[1]).select(0, flat / W).select(0, flat % W);
      e.fill_(at(e, {}) + at(g, i));
    });
    KILN_CHECK_CLOSE(max_pool2d_backward(strided_copy(g), r.indices, x.shape()), expected, 1e-12,
                     1e-12);
  }
}

TEST_CASE("pooling backward ops in 16-bit floats accumulate in f32", "[pool]") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    INFO(name(dtype));
    const double t = tol(dtype);
    const Tensor x = randn({1, 2, 6, 6}).to(dtype);
    MaxPool2dResult r = max_pool2d_with_indices(x, {3}, {1});
    const Tensor g = randn(r.values.shape()).to(dtype);
    Tensor gx = max_pool2d_backward(g, r.indices, x.shape());
    CHECK(gx.dtype() == dtype);
    KILN_CHECK_CLOSE(gx, max_pool2d_backward(g.to(DType::f64), r.indices, x.shape()), t, t);
    gx = avg_pool2d_backward(g, x.shape(), {3}, {1});
    CHECK(gx.dtype() == dtype);
    KILN_CHECK_CLOSE(gx, avg_pool2d_backward(g.to(DType::f64), x.shape(), {3}, {1}), t, t);
    gx = adaptive_avg_pool2d_backward(g, x.shape());
    KILN_CHECK_CLOSE(gx, adaptive_avg_pool2d_backward(g.to(DType::f64), x.shape()), t, t);
  }
}

TEST_CASE("pooling rejects bad input", "[pool]") {
  const Tensor x = randn({1, 2, 5, 5});
  using Catch::Contains;
  CHECK_THROWS_WITH(max_pool2d(randn({5, 5}), {2}), Contains("max_pool2d") && Contains("f32[5,5]"));
  CHECK_THROWS_WITH(max_pool2d(zeros({1, 2, 5, 5}, {.dtype = DType::i64}), {2}),
                    Contains("max_pool2d") && Contains("floating"));
  CHECK_THROWS_WITH(max_pool2d(x, {2}, {}, {2}), Contains("max_pool2d") && Contains("padding"));
  CHECK_THROWS_WITH(avg_pool2d(x, {3}, {}, {2}), Contains("avg_pool2d") && Contains("padding"));
  CHECK_THROWS_WITH(max_pool2d(x, {6}), Contains("max_pool2d") && Contains("too small"));
  CHECK_THROWS_WITH(max_pool2d(x, {3}, {}, {0}, {3}), Contains("too small"));
  CHECK_THROWS_WITH(max_pool2d(x, {2, 2, 2}), Contains("max_pool2d") && Contains("kernel_size"));
  CHECK_THROWS_WITH(max_pool2d(x, {0}), Contains("max_pool2d") && Contains("positive"));
  CHECK_THROWS_WITH(max_pool2d(x, {2}, {0}), Contains("positive"));
  CHECK_THROWS_WITH(avg_pool2d(x, {2}, {}, {0}, false, true, 0),
                    Contains("avg_pool2d") && Contains("divisor_override"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d(randn({2, 5}), {2}), Contains("adaptive_avg_pool2d"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d(x, {-1, 2}), Contains("adaptive_avg_pool2d"));
  CHECK_THROWS_AS(adaptive_avg_pool2d(x, {1, 2, 3}), Error);

  MaxPool2dResult r = max_pool2d_with_indices(x, {2});
  CHECK_THROWS_WITH(max_pool2d_backward(r.values, r.indices.to(DType::i32), x.shape()),
                    Contains("max_pool2d_backward") && Contains("i64"));
  CHECK_THROWS_WITH(max_pool2d_backward(r.values, r.indices, {1, 3, 5, 5}),
                    Contains("max_pool2d_backward") && Contains("input_size"));
  CHECK_THROWS_WITH(max_pool2d_backward(r.values, r.indices, {2, 5, 5}),
                    Contains("max_pool2d_backward"));
  CHECK_THROWS_WITH(max_pool2d_backward(r.values, r.indices + int64_t{100}, x.shape()),
                    Contains("max_pool2d_backward") && Contains("outside"));
  CHECK_THROWS_WITH(avg_pool2d_backward(randn({1, 2, 3, 3}), x.shape(), {2}),
                    Contains("avg_pool2d_backward") && Contains("f32[1,2,3,3]"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d_backward(randn({1, 2, 3, 3}), {1, 2, 5}),
                    Contains("adaptive_avg_pool2d_backward"));
}

TEST_CASE("pooling splits many planes among threads", "[pool]") {
  // Enough planes that parallel_for uses every thread.
  const Tensor x = randn({3, 1000, 4, 4}, {.dtype = DType::f64});
  const Window w{{2}, {1}, {1}, {1}, false};
  auto [values_ref, indices_ref] = ref_max_pool(x, w);
  MaxPool2dResult r = max_pool2d_with_indices(x, {2}, {1}, {1});
  KILN_CHECK_EQUAL(r.values, values_ref);
  KILN_CHECK_EQUAL(r.indices, indices_ref);
  KILN_CHECK_CLOSE(avg_pool2d(x, {2}, {1}, {1}), ref_avg_pool(x, w, true, std::nullopt), 1e-12,
                   1e-12);
  const Tensor g = randn(r.values.shape(), {.dtype = DType::f64});
  const Tensor gx = avg_pool2d_backward(g, x.shape(), {2}, {1}, {1});
  const double lhs = dot(avg_pool2d(x, {2}, {1}, {1}), g), rhs = dot(x, gx);
  CHECK(std::fabs(lhs - rhs) <= 1e-12 * (1 + std::fabs(lhs)));
  // The max backward of the whole batch equals that of each sample alone.
  const Tensor gm = max_pool2d_backward(g, r.indices, x.shape());
  for (int64_t n = 0; n < 3; ++n)
    KILN_CHECK_EQUAL(gm[n], max_pool2d_backward(g[n], r.indices[n], x[n].shape()));
}
