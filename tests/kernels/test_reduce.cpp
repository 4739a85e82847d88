// Reductions against naive loops: every dim subset of a 3-d tensor, keepdim both ways,
// contiguous, strided and transposed inputs, every dtype each op supports.
// Tolerances: results are computed in double (f16/bf16 at least in f32) and rounded once
// to the output dtype, so rtol = atol = testing::tol(output dtype); integer, bool, index
// and max/min results must match exactly.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/ops/reduce.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Group = std::vector<double>;

// For each output position of reducing `dims` of x, the values that reduce into it, in
// row-major order of the reduced dims; the naive definition of a reduction.
std::vector<Group> groups_of(const Tensor& x, const std::vector<bool>& reduced) {
  int64_t n_out = 1;
  for (size_t d = 0; d < reduced.size(); ++d)
    if (!reduced[d]) n_out *= x.shape()[d];
  std::vector<Group> groups(static_cast<size_t>(n_out));
  for_each_index(x.shape(), [&](const std::vector<int64_t>& idx) {
    int64_t o = 0;
    for (size_t d = 0; d < reduced.size(); ++d)
      if (!reduced[d]) o = o * x.shape()[d] + idx[d];
    groups[static_cast<size_t>(o)].push_back(at(x, idx));
  });
  return groups;
}

// The f64 tensor of f(group) for each output of reducing `dims` of x.
// The input's groups for reducing `dims`, and the result shape; of(f) is the f64 tensor of
// f(group) for each output.
class Reference {
 public:
  Reference(const Tensor& x, const DimList& dims, bool keepdim) {
    const std::vector<bool> reduced = reduced_dims(x.shape(), dims, "reference");
    groups_ = groups_of(x, reduced);
    shape_ = reduced_shape(x.shape(), reduced, keepdim);
  }
  Tensor of(const std::function<double(const Group&)>& f) const {
    std::vector<double> out;
    for (const Group& g : groups_) out.push_back(f(g));
    return from_vector<double>(out, {static_cast<int64_t>(out.size())}).reshape(shape_);
  }

 private:
  std::vector<Group> groups_;
  Shape shape_;
};

Tensor reference(const Tensor& x, const DimList& dims, bool keepdim,
                 const std::function<double(const Group&)>& f) {
  return Reference(x, dims, keepdim).of(f);
}

double ref_sum(const Group& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double ref_prod(const Group& g) {
  double s = 1;
  for (double v : g) s *= v;
  return s;
}
double ref_mean(const Group& g) { return ref_sum(g) / static_cast<double>(g.size()); }
double ref_var(const Group& g, double correction) {
  const double m = ref_mean(g);
  double s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / std::max(0.0, static_cast<double>(g.size()) - correction);
}
// The first position of the largest (smallest) value; a NaN wins.
double ref_arg(const Group& g, bool is_max) {
  size_t best = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
double ref_extreme(const Group& g, bool is_max) {
  return g[static_cast<size_t>(ref_arg(g, is_max))];
}
double ref_logsumexp(const Group& g) {
  double s = 0;
  const double m = ref_extreme(g, true);
  for (double v : g) s += std::exp(v - m);
  return m + std::log(s);
}
double ref_norm(const Group& g, double p) {
  double s = 0;
  if (std::isinf(p)) {
    s = std::fabs(g[0]);
    for (double v : g) s = p > 0 ? std::max(s, std::fabs(v)) : std::min(s, std::fabs(v));
    return s;
  }
  for (double v : g) s += p == 0 ? (v != 0) : std::pow(std::fabs(v), p);
  return p == 0 ? s : std::pow(s, 1 / p);
}

// Random values of `dtype`: normal floats, small integers (so that products stay exact).
Tensor sample(DType dtype, const Shape& shape) {
  if (is_floating(dtype)) return randn(shape, {.dtype = DType::f64}).to(dtype);
  if (dtype == DType::boolean) return randint(0, 2, shape).to(dtype);
  if (dtype == DType::u8) return randint(0, 3, shape).to(dtype);
  return randint(-1, 3, shape).to(dtype);
}

// The same values as contiguous, strided, transposed and permuted tensors (the last stored
// with dim 2 outermost and dim 0 innermost).
std::vector<Tensor> layouts(const Tensor& x) {
  return {x, strided_copy(x), transposed_copy(x),
          x.permute({2, 1, 0}).contiguous().permute({2, 1, 0})};
}

const std::vector<DimList> kDimLists = {{},     {0},    {1},     {2},      {-1},     {0, 1},
                                        {0, 2}, {1, 2}, {2, -3}, {-3, -2}, {0, 1, 2}};
const Shape kShape = {3, 4, 5};

// Runs body(x, dims, keepdim) over every dtype in `dtypes`, layout, dim list and keepdim.
void sweep(const std::vector<DType>& dtypes,
           const std::function<void(const Tensor&, const DimList&, bool)>& body) {
  for (DType dtype : dtypes) {
    const Tensor base = sample(dtype, kShape);
    const std::vector<Tensor> xs = layouts(base);
    for (size_t layout = 0; layout < xs.size(); ++layout) {
      for (const DimList& dims : kDimLists) {
        for (bool keepdim : {false, true}) {
          INFO("dtype " << name(dtype) << ", layout " << layout << " (0 contiguous, 1 strided, "
                        << "2 transposed, 3 permuted), dims ["
                        << fmt::format("{}", fmt::join(dims, ",")) << "], keepdim " << keepdim);
          body(xs[layout], dims, keepdim);
        }
      }
    }
  }
}

DType sum_dtype(DType t) { return is_integral(t, true) ? DType::i64 : t; }

}  // namespace

TEST_CASE("sum over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor s = sum(x, dims, keepdim);
    CHECK(s.dtype() == sum_dtype(x.dtype()));
    const double t = tol(s.dtype());
    KILN_CHECK_CLOSE(s, reference(x, dims, keepdim, ref_sum), t, t);
    const Tensor s64 = sum(x, dims, keepdim, DType::f64);
    CHECK(s64.dtype() == DType::f64);
    KILN_CHECK_CLOSE(s64, reference(x, dims, keepdim, ref_sum), 1e-12, 1e-12);
  });
}

TEST_CASE("prod over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor p = prod(x, dims, keepdim);
    CHECK(p.dtype() == sum_dtype(x.dtype()));
    const double t = tol(p.dtype());
    KILN_CHECK_CLOSE(p, reference(x, dims, keepdim, ref_prod), t, t);
  });
}

TEST_CASE("mean over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor expected = reference(x, dims, keepdim, ref_mean);
    if (is_floating(x.dtype())) {
      const Tensor m = mean(x, dims, keepdim);
      CHECK(m.dtype() == x.dtype());
      KILN_CHECK_CLOSE(m, expected, tol(x.dtype()), tol(x.dtype()));
    }
    const Tensor m32 = mean(x, dims, keepdim, DType::f32);
    CHECK(m32.dtype() == DType::f32);
    KILN_CHECK_CLOSE(m32, expected, 1e-5, 1e-6);
  });
}

TEST_CASE("amax and amin over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor hi = amax(x, dims, keepdim), lo = amin(x, dims, keepdim);
    CHECK(hi.dtype() == x.dtype());
    CHECK(lo.dtype() == x.dtype());
    KILN_CHECK_EQUAL(
        hi, reference(x, dims, keepdim, [](const Group& g) { return ref_extreme(g, true); }));
    KILN_CHECK_EQUAL(
        lo, reference(x, dims, keepdim, [](const Group& g) { return ref_extreme(g, false); }));
  });
}

TEST_CASE("max / min / argmax and argmin along each dim / every layout and dtype", "[reduce]") {
  for (DType dtype : kAllDTypes) {
    // Integer samples repeat values, so these also check that ties give the first position.
    const Tensor base = sample(dtype, kShape);
    for (const Tensor& x : layouts(base)) {
      for (int64_t dim : {0, 1, 2, -1, -3}) {
        for (bool keepdim : {false, true}) {
          INFO("dtype " << name(dtype) << ", " << describe(x) << "\ndim " << dim << ", keepdim "
                        << keepdim);
          for (bool is_max : {true, false}) {
            const ValuesIndices r = is_max ? max(x, dim, keepdim) : min(x, dim, keepdim);
            CHECK(r.values.dtype() == dtype);
            CHECK(r.indices.dtype() == DType::i64);
            auto value = [=](const Group& g) { return ref_extreme(g, is_max); };
            auto index = [=](const Group& g) { return ref_arg(g, is_max); };
            KILN_CHECK_EQUAL(r.values, reference(x, {dim}, keepdim, value));
            KILN_CHECK_EQUAL(r.indices, reference(x, {dim}, keepdim, index));
            const Tensor a = is_max ? argmax(x, dim, keepdim) : argmin(x, dim, keepdim);
            CHECK(a.dtype() == DType::i64);
            KILN_CHECK_EQUAL(a, r.indices);
          }
        }
      }
      for (bool is_max : {true, false}) {
        // Without a dim: the whole tensor, positions in its row-major flattening.
        auto index = [=](const Group& g) { return ref_arg(g, is_max); };
        KILN_CHECK_EQUAL(is_max ? argmax(x) : argmin(x), reference(x, {}, false, index));
        KILN_CHECK_EQUAL(is_max ? argmax(x, std::nullopt, true) : argmin(x, std::nullopt, true),
                         reference(x, {}, true, index));
        auto value = [=](const Group& g) { return ref_extreme(g, is_max); };
        const Tensor v = is_max ? max(x) : min(x);
        CHECK(v.dim() == 0);
        KILN_CHECK_EQUAL(v, reference(x, {}, false, value));
      }
    }
  }
}

TEST_CASE("var and std over every dim subset / layout and floating dtype", "[reduce]") {
  sweep(kFloatDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    for (double correction : {1.0, 0.0}) {
      INFO("correction " << correction);
      const double t = tol(x.dtype());
      auto v = [=](const Group& g) { return ref_var(g, correction); };
      auto s = [=](const Group& g) { return std::sqrt(ref_var(g, correction)); };
      const Tensor vx = var(x, dims, correction, keepdim);
      CHECK(vx.dtype() == x.dtype());
      KILN_CHECK_CLOSE(vx, reference(x, dims, keepdim, v), t, t);
      const Tensor sx = kiln::std(x, dims, correction, keepdim);
      KILN_CHECK_CLOSE(sx, reference(x, dims, keepdim, s), t, t);
      // Unqualified under `using namespace kiln`, where a bare std(x) does not compile.
      KILN_CHECK_EQUAL(std_dev(x, dims, correction, keepdim), sx);
    }
  });
}

TEST_CASE("logsumexp over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor l = logsumexp(x, dims, keepdim);
    const DType expected_dtype = is_floating(x.dtype()) ? x.dtype() : DType::f32;
    CHECK(l.dtype() == expected_dtype);
    const double t = tol(expected_dtype);
    KILN_CHECK_CLOSE(l, reference(x, dims, keepdim, ref_logsumexp), t, t);
  });
}

TEST_CASE("all and any over every dim subset / layout and dtype", "[reduce]") {
  sweep(kAllDTypes, [](const Tensor& x, const DimList& dims, bool keepdim) {
    const Tensor a = all(x, dims, keepdim), n = any(x, dims, keepdim);
    const DType expected = x.dtype() == DType::u8 ? DType::u8 : DType::boolean;  // PyTorch's rule
    CHECK(a.dtype() == expected);
    CHECK(n.dtype() == expected);
    KILN_CHECK_EQUAL(a, reference(x, dims, keepdim, [](const Group& g) {
                       return static_cast<double>(
                           std::all_of(g.begin(), g.end(), [](double v) { return v != 0; }));
                     }));
    KILN_CHECK_EQUAL(n, reference(x, dims, keepdim, [](const Group& g) {
                       return static_cast<double>(
                           std::any_of(g.begin(), g.end(), [](double v) { return v != 0; }));
                     }));
  });
}

TEST_CASE("norm over every dim subset / layout and floating dtype", "[reduce]") {
  const double inf = std::numeric_limits<double>::infinity();
  sweep(kFloatDTypes, [&](const Tensor& x, const DimList& dims, bool keepdim) {
    for (double p : {2.0, 1.0, inf, -inf, 0.0, 3.0, 0.5}) {
      INFO("p " << p);
      const Tensor n = norm(x, p, dims, keepdim);
      CHECK(n.dtype() == x.dtype());
      const double t = tol(x.dtype());
      KILN_CHECK_CLOSE(
          n, reference(x, dims, keepdim, [=](const Group& g) { return ref_norm(g, p); }), t, t);
    }
  });
  const Tensor x = from_vector<float>({3, -4});
  KILN_CHECK_CLOSE(norm(x), scalar_tensor(5, DType::f32), 1e-6, 0);
}

// Sizes that take the threaded paths: many outputs, and few outputs over a long reduced
// range (split among threads and combined in order).
TEST_CASE("large reductions take the parallel paths and agree with the loops", "[reduce]") {
  struct Case {
    Shape shape;
    DimList dims;
  };
  const std::vector<Case> cases = {
      {{70000}, {}},                 // one output, the range split among threads
      {{40000, 3}, {0}},             // inner dim kept: rows accumulated, range split
      {{8, 16, 16, 16}, {0, 2, 3}},  // batch norm's statistics of NCHW
      {{32, 2048}, {1}},             // many rows
      {{3, 20000}, {0}},             // many columns
  };
  for (const Case& c : cases) {
    INFO("shape " << shape_str(c.shape) << ", dims [" << fmt::format("{}", fmt::join(c.dims, ","))
                  << "]");
    const Tensor x = randn(c.shape, {.dtype = DType::f64}).to(DType::f32);
    const Reference ref(x, c.dims, false);
    KILN_CHECK_CLOSE(sum(x, c.dims), ref.of(ref_sum), 1e-5, 1e-4);
    KILN_CHECK_CLOSE(var(x, c.dims), ref.of([](const Group& g) { return ref_var(g, 1); }), 1e-5,
                     1e-5);
    KILN_CHECK_EQUAL(amax(x, c.dims), ref.of([](const Group& g) { return ref_extreme(g, true); }));
    KILN_CHECK_CLOSE(logsumexp(x, c.dims), ref.of(ref_logsumexp), 1e-5, 1e-5);
    if (c.dims.size() <= 1) {
      const Tensor a = c.dims.empty() ? argmin(x) : argmin(x, c.dims[0]);
      KILN_CHECK_EQUAL(a, ref.of([](const Group& g) { return ref_arg(g, false); }));
    }
  }
}
