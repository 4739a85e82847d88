// softmax, log_softmax and their backward ops against naive f64 loops.
#include <limits>

#include "core/ops/softmax.h"
#include "kernels/cpu/exp_f32.h"
#include "kernels/cpu/wide.h"
#include "testing.h"

using namespace kiln;
using testing::at;
using testing::for_each_index;
using testing::tensor_of;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// softmax (or log_softmax) of x along dim, in f64, one row at a time.
Tensor reference_softmax(const Tensor& x, int64_t dim, bool log) {
  dim = wrap_dim(dim, x.dim(), "reference");
  Tensor y = zeros(x.shape(), {.dtype = DType::f64});
  if (x.dim() == 0) return log ? y : y.fill_(1.0);
  const Shape strides = contiguous_strides(x.shape());
  double* py = y.data_ptr<double>();
  for_each_index(x.shape(), [&](const std::vector<int64_t>& idx) {
    if (idx[dim] != 0) return;
    std::vector<int64_t> i = idx;
    auto offset = [&] {
      int64_t o = 0;
      for (size_t d = 0; d < i.size(); ++d) o += i[d] * strides[d];
      return o;
    };
    double max = -kInf, sum = 0;
    for (i[dim] = 0; i[dim] < x.size(dim); ++i[dim]) max = std::max(max, at(x, i));
    for (i[dim] = 0; i[dim] < x.size(dim); ++i[dim]) sum += std::exp(at(x, i) - max);
    for (i[dim] = 0; i[dim] < x.size(dim); ++i[dim])
      py[offset()] = log ? at(x, i) - max - std::log(sum) : std::exp(at(x, i) - max) / sum;
  });
  return y;
}

// The naive backward: softmax gx = y (g - sum(g y)), log_softmax gx = g - exp(y) sum(g).
Tensor reference_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log) {
  dim = wrap_dim(dim, y.dim(), "reference");
  Tensor gx = zeros(y.shape(), {.dtype = DType::f64});
  const Shape strides = contiguous_strides(y.shape());
  double* p = gx.data_ptr<double>();
  if (y.dim() == 0) {
    p[0] = log ? at(g, {}) - std::exp(at(y, {})) * at(g, {}) : 0.0;
    return gx;
  }
  for_each_index(y.shape(), [&](const std::vector<int64_t>& idx) {
    if (idx[dim] != 0) return;
    std::vector<int64_t> i = idx;
    double sum = 0;
    for (i[dim] = 0; i[dim] < y.size(dim); ++i[dim]) sum += log ? at(g, i) : at(g, i) * at(y, i);
    for (i[dim] = 0; i[dim] < y.size(dim); ++i[dim]) {
      int64_t o = 0;
      for (size_t d = 0; d < i.size(); ++d) o += i[d] * strides[d];
      p[o] = log ? at(g, i) - std::exp(at(y, i)) * sum : at(y, i) * (at(g, i) - sum);
    }
  });
  return gx;
}

Tensor random(Shape shape, DType dtype, double scale = 3.0) {
  return (randn(std::move(shape), {.dtype = DType::f64}) * scale).to(dtype);
}

}  // namespace

TEST_CASE("softmax and log_softmax: hand-checked values", "[softmax]") {
  const Tensor x = tensor_of({1, 2, 3}, {3});
  // Tolerance 1e-6: the constants carry 8 digits.
  KILN_CHECK_CLOSE(softmax(x, 0), tensor_of({0.09003057, 0.24472847, 0.66524096}, {3}), 1e-6, 1e-7);
  KILN_CHECK_CLOSE(log_softmax(x, -1), tensor_of({-2.40760596, -1.40760596, -0.40760596}, {3}),
                   1e-6, 1e-7);
  // Huge logits do not overflow: the row max is subtracted first.
  const Tensor big = tensor_of({1000, 1001, 1002}, {1, 3});
  KILN_CHECK_CLOSE(softmax(big, 1), tensor_of({0.09003057, 0.24472847, 0.66524096}, {1, 3}), 1e-6,
                   1e-7);
  KILN_CHECK_CLOSE(log_softmax(big, 1), tensor_of({-2.40760596, -1.40760596, -0.40760596}, {1, 3}),
                   1e-6, 1e-7);
}

TEST_CASE("softmax: every dim / every floating dtype / contiguous and strided", "[softmax]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::bf16);
  const bool log = GENERATE(false, true);
  const Tensor base = random({3, 4, 5}, dtype);
  // Tolerance: testing::tol(dtype) relative, and absolute for the values near 0.
  const double tol = testing::tol(dtype) * 2;
  for (int64_t dim = -3; dim < 3; ++dim) {
    for (const Tensor& x : {base, testing::strided_copy(base), testing::transposed_copy(base),
                            base.permute({2, 0, 1}).contiguous().permute({1, 2, 0})}) {
      INFO("dim " << dim << ", dtype " << name(dtype) << ", strides " << shape_str(x.strides()));
      const Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      CHECK(y.dtype() == dtype);
      CHECK(y.is_contiguous());
      KILN_CHECK_CLOSE(y, reference_softmax(x, dim, log), tol, tol);
    }
  }
}

TEST_CASE("softmax: rows larger than one parallel task and lane blocks", "[softmax]") {
  // 64 x 1100 elements exceed the parallel grain; 130 lanes span three lane blocks, as do
  // the 130 rows of a transposed [6, 130] matrix.
  const bool log = GENERATE(false, true);
  for (Shape shape : {Shape{64, 1100}, Shape{3, 7, 130}, Shape{130, 6}}) {
    const Tensor x = shape[1] == 6 ? random({6, 130}, DType::f32).t() : random(shape, DType::f32);
    for (int64_t dim : {0, 1, -1}) {
      INFO("shape " << shape_str(shape) << " dim " << dim);
      KILN_CHECK_CLOSE(log ? log_softmax(x, dim) : softmax(x, dim), reference_softmax(x, dim, log),
                       1e-5, 1e-6);
    }
  }
}

TEST_CASE("softmax: -inf and NaN follow PyTorch", "[softmax]") {
  const Tensor x = tensor_of({-kInf, -kInf, -kInf, 0, -kInf, 0, 1, kNaN, 2}, {3, 3});
  // A row of all -inf is NaN; -inf among finite values gives 0 (log: -inf); NaN poisons its row.
  KILN_CHECK_EQUAL(softmax(x, 1),
                   tensor_of({kNaN, kNaN, kNaN, 0.5, 0, 0.5, kNaN, kNaN, kNaN}, {3, 3}));
  const Tensor l = log_softmax(x, 1);
  CHECK(std::isnan(at(l, {0, 0})));
  CHECK(at(l, {1, 1}) == -kInf);
  CHECK(at(l, {1, 0}) == Approx(std::log(0.5)));
  CHECK(std::isnan(at(l, {2, 0})));
  // The same along a dim that is not innermost.
  KILN_CHECK_EQUAL(softmax(x.t().contiguous(), 0),
                   tensor_of({kNaN, kNaN, kNaN, 0.5, 0, 0.5, kNaN, kNaN, kNaN}, {3, 3}).t());
}

TEST_CASE("softmax: 0-d / size-1 and empty inputs", "[softmax]") {
  KILN_CHECK_EQUAL(softmax(tensor_of({4.0}, {}), 0), tensor_of({1.0}, {}));
  KILN_CHECK_EQUAL(log_softmax(tensor_of({4.0}, {}), -1), tensor_of({0.0}, {}));
  KILN_CHECK_EQUAL(softmax(tensor_of({1, 2}, {2, 1}), 1), tensor_of({1, 1}, {2, 1}));
  CHECK(softmax(zeros({0, 3}), 1).shape() == Shape{0, 3});
  CHECK(log_softmax(zeros({2, 0}), 1).shape() == Shape{2, 0});
}

TEST_CASE("softmax: integer inputs need a dtype", "[softmax]") {
  const Tensor i = tensor_of({1, 2, 3}, {3}, DType::i64);
  CHECK_THROWS_WITH(softmax(i, 0), Catch::Contains("softmax") && Catch::Contains("i64[3]"));
  CHECK_THROWS_WITH(log_softmax(i, 0), Catch::Contains("log_softmax"));
  const Tensor y = softmax(i, 0, DType::f64);
  CHECK(y.dtype() == DType::f64);
  KILN_CHECK_CLOSE(y, tensor_of({0.09003057, 0.24472847, 0.66524096}, {3}), 1e-6, 1e-7);
  CHECK(log_softmax(tensor_of({1, 2}, {2}), 0, DType::f16).dtype() == DType::f16);
  CHECK_THROWS_WITH(softmax(tensor_of({1, 2}, {2}), 0, DType::i32),
                    Catch::Contains("softmax") && Catch::Contains("floating"));
}

TEST_CASE("softmax: a dim out of range is an error", "[softmax]") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(softmax(x, 2), Catch::Contains("softmax") && Catch::Contains("dim 2"));
  CHECK_THROWS_WITH(log_softmax(x, -3), Catch::Contains("log_softmax"));
  CHECK_THROWS_AS(softmax_backward(x, x, 5), Error);
}

TEST_CASE("softmax_backward and log_softmax_backward: naive loops", "[softmax]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::bf16);
  const bool log = GENERATE(false, true);
  const Tensor x = random({3, 4, 5}, dtype);
  const double tol = testing::tol(dtype) * 4;
  for (int64_t dim = -3; dim < 3; ++dim) {
    const Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
    const Tensor g = random({3, 4, 5}, dtype, 1.0);
    for (const Tensor& gs : {g, testing::transposed_copy(g)}) {
      INFO("dim " << dim << ", dtype " << name(dtype));
      const Tensor gx = log ? log_softmax_backward(gs, testing::strided_copy(y), dim)
                            : softmax_backward(gs, testing::strided_copy(y), dim);
      CHECK(gx.dtype() == dtype);
      KILN_CHECK_CLOSE(gx, reference_backward(gs, y, dim, log), tol, tol);
    }
  }
}

TEST_CASE("softmax_backward: matches finite differences of the forward", "[softmax]") {
  const bool log = GENERATE(false, true);
  const Tensor x = random({2, 3, 4}, DType::f64, 1.0);
  const Tensor g = random({2, 3, 4}, DType::f64, 1.0);
  for (int64_t dim : {0, 1, 2}) {
    auto f = [&](const Tensor& in) { return log ? log_softmax(in, dim) : softmax(in, dim); };
    const Tensor gx = log ? log_softmax_backward(g, f(x), dim) : softmax_backward(g, f(x), dim);
    // d/dx sum(g * f(x)) by central differences (h = 1e-6, error ~1e-9).
    Tensor numeric = zeros(x.shape(), {.dtype = DType::f64});
    const std::vector<double> gv = testing::values(g);
    for (int64_t i = 0; i < x.numel(); ++i) {
      double sides[2];
      for (int s = 0; s < 2; ++s) {
        Tensor xp = x.clone();
        xp.data_ptr<double>()[i] += s == 0 ? 1e-6 : -1e-6;
        const std::vector<double> yv = testing::values(f(xp));
        sides[s] = 0;
        for (size_t k = 0; k < yv.size(); ++k) sides[s] += gv[k] * yv[k];
      }
      numeric.data_ptr<double>()[i] = (sides[0] - sides[1]) / 2e-6;
    }
    INFO("dim " << dim);
    KILN_CHECK_CLOSE(gx, numeric, 1e-6, 1e-7);
  }
}

TEST_CASE("softmax_backward: large rows and lane blocks", "[softmax]") {
  const bool log = GENERATE(false, true);
  for (Shape shape : {Shape{64, 1100}, Shape{3, 7, 130}}) {
    const Tensor x = random(shape, DType::f32);
    const Tensor g = random(shape, DType::f32, 1.0);
    for (int64_t dim : {0, 1}) {
      const Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      INFO("shape " << shape_str(shape) << " dim " << dim);
      KILN_CHECK_CLOSE(log ? log_softmax_backward(g, y, dim) : softmax_backward(g, y, dim),
                       reference_backward(g, y, dim, log), 1e-4, 1e-5);
    }
  }
}

TEST_CASE("softmax_backward: bad inputs are errors", "[softmax]") {
  CHECK_THROWS_WITH(softmax_backward(zeros({2, 3}), zeros({3, 2}), 1),
                    Catch::Contains("softmax_backward") && Catch::Contains("f32[2,3]"));
  CHECK_THROWS_WITH(log_softmax_backward(zeros({2}, {.dtype = DType::i64}), zeros({2}), 0),
                    Catch::Contains("log_softmax_backward") && Catch::Contains("i64[2]"));
}

TEST_CASE("exp_f32: within 2 ulp of exp over its range, and its edges", "[softmax][exp]") {
  // Every 97th float from -87.33 to 88.37 (about 500,000 of them, all exponents), against
  // exp in double: within 2 ulp of the f32 result.
  double worst = 0;
  for (float x = -87.33f; x < 88.37f; x = std::nextafter(x, 100.0f)) {
    for (int skip = 0; skip < 96 && x < 88.37f; ++skip) x = std::nextafter(x, 100.0f);
    const double exact = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(exact), 1e39f) - static_cast<float>(exact);
    worst = std::max(worst, std::abs(cpu::exp_f32(x) - exact) / ulp);
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst <= 2.0);
  CHECK(cpu::exp_f32(0.0f) == 1.0f);
  CHECK(cpu::exp_f32(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(cpu::exp_f32(-90.0f) == 0.0f);  // below f32's normal range
  CHECK(std::isinf(cpu::exp_f32(89.0f)));
  CHECK(std::isinf(cpu::exp_f32(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(cpu::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("softmax: f32 rows as long as a vocabulary, against f64", "[softmax]") {
  // The vectorized f32 row path (kernels/cpu/softmax.cpp): rows of 30522 (BERT's vocabulary)
  // and lengths that leave every tail of its 16 lanes; inputs 4 randn, so |x - max| < 32.
  // f32's x - max rounds by up to 0.5 ulp(32) = 2^-20 absolute, which exp turns into a
  // relative error; then exp_f32's 2 ulp, and one rounding each of the sum's inverse and the
  // product: softmax within 2^-20 + 4 * 2^-24 < 1.2e-6 relative (rtol 2e-6). log_softmax:
  // the same 2^-20, 0.5 ulp of the log of the sum (< 11) and of the result (< 43): 4.3e-6
  // absolute (atol 5e-6).
  for (int64_t n : {int64_t{30522}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{33}}) {
    const Tensor x = random({3, n}, DType::f32, 4.0);
    INFO("n " << n);
    KILN_CHECK_CLOSE(softmax(x, 1), reference_softmax(x, 1, false), 2e-6, 1e-30);
    KILN_CHECK_CLOSE(log_softmax(x, 1), reference_softmax(x, 1, true), 0.0, 5e-6);
    const Tensor g = random({3, n}, DType::f32, 1.0);
    for (bool log : {false, true}) {
      const Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
      // sum(g) (or sum(g y)) in double lanes, rounded once; exp_f32(y) within 2 ulp.
      KILN_CHECK_CLOSE(log ? log_softmax_backward(g, y, 1) : softmax_backward(g, y, 1),
                       reference_backward(g, y, 1, log), 1e-5, 1e-6);
    }
  }
}

TEST_CASE("softmax: the f32 rows' AVX-512 build gives the plain build's bits", "[softmax]") {
  cpu::set_wide_loops(false);
  const bool has_wide = testing::wide_loops_available();
  if (!has_wide) {
    WARN("this CPU has no AVX-512: one build only");
    return;
  }
  const Tensor x = random({4, 1003}, DType::f32), g = random({4, 1003}, DType::f32, 1.0);
  Tensor out[2][4];
  for (int wide : {0, 1}) {
    cpu::set_wide_loops(wide == 1);
    out[wide][0] = softmax(x, 1);
    out[wide][1] = log_softmax(x, 1);
    out[wide][2] = softmax_backward(g, out[wide][0], 1);
    out[wide][3] = log_softmax_backward(g, out[wide][1], 1);
  }
  cpu::set_wide_loops(true);
  for (int i = 0; i < 4; ++i) {
    INFO("output " << i);
    CHECK(testing::same_bits(out[0][i], out[1][i]));
  }
}
