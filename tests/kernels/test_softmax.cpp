// softmax, log_softmax and their backward ops against naive f64 loops.
#include <limits>

#include "core/ops/softmax.h"
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
