// matmul, mm, bmm and addmm against a naive triple loop in doubles, on every shape case of
// torch.matmul, on transposed, strided and broadcast operands, with every GEMM backend.
#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "core/ops/linalg.h"
#include "kernels/cpu/gemm.h"
#include "testing.h"
#include "tolerance.h"

using namespace kiln;
using namespace kiln::testing;
using kiln::cpu::GemmBackend;

namespace {

// The products the tests expect, summed in doubles over the operands' values.
Tensor naive_matmul(const Tensor& a0, const Tensor& b0) {
  const Tensor a = a0.dim() == 1 ? a0.unsqueeze(0) : a0;
  const Tensor b = b0.dim() == 1 ? b0.unsqueeze(1) : b0;
  const Shape shapes[] = {Shape(a.shape().begin(), a.shape().end() - 2),
                          Shape(b.shape().begin(), b.shape().end() - 2)};
  const Shape batch = broadcast_shapes(shapes, "naive_matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape sa = batch, sb = batch, full = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  full.insert(full.end(), {m, n});
  const Tensor ae = a.expand(sa), be = b.expand(sb);
  std::vector<double> out;
  for_each_index(full, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> ia = idx, ib = idx;
    const size_t nd = idx.size();
    double s = 0;
    for (int64_t p = 0; p < k; ++p) {
      ia[nd - 1] = p;
      ib[nd - 2] = p;
      s += at(ae, ia) * at(be, ib);
    }
    out.push_back(s);
  });
  Shape shape = batch;
  if (a0.dim() >= 2) shape.push_back(m);
  if (b0.dim() >= 2) shape.push_back(n);
  return tensor_of(out, {static_cast<int64_t>(out.size())}, DType::f64).reshape(shape);
}

std::vector<GemmBackend> backends() { return cpu::gemm_backends(); }

// Selects a GEMM backend for one scope.
struct BackendScope {
  GemmBackend previous = cpu::gemm_backend();
  explicit BackendScope(GemmBackend b) { cpu::set_gemm_backend(b); }
  ~BackendScope() { cpu::set_gemm_backend(previous); }
};

// f32: relative 1e-5 plus 1e-5 absolute, for sums of a handful of N(0,1) products.
constexpr double kF32 = 1e-5;

}  // namespace

TEST_CASE("matmul: every shape case of torch.matmul against a naive loop", "[linalg]") {
  const auto backend = GENERATE(from_range(backends()));
  BackendScope scope(backend);
  const auto dtype = GENERATE(DType::f32, DType::f64);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3}, {3}},                 // dot
      {{3}, {3, 4}},              // row vector
      {{2, 3}, {3}},              // matrix-vector
      {{2, 3}, {3, 4}},           // matrix
      {{5}, {2, 5, 3}},           // vector @ stack
      {{2, 4, 5}, {5}},           // stack @ vector
      {{2, 3, 4}, {4, 5}},        // stack @ matrix (one tall GEMM)
      {{3, 4}, {2, 4, 5}},        // matrix @ stack
      {{2, 1, 3, 4}, {5, 4, 2}},  // batch dims broadcast both ways
      {{1, 3, 4}, {2, 4, 5}},
      {{7, 2, 3}, {7, 3, 2}},  // many small products: threads over the batch
      {{0, 3}, {3, 4}},        // empty result
      {{2, 0}, {0, 3}},        // empty sum: zeros
      {{1, 1}, {1, 1}},
  };
  for (const auto& [sa, sb] : cases) {
    INFO(shape_str(sa) << " @ " << shape_str(sb) << " in " << name(dtype));
    const Tensor a = randn(sa, {.dtype = dtype}), b = randn(sb, {.dtype = dtype});
    const Tensor r = matmul(a, b);
    CHECK(r.dtype() == dtype);
    KILN_CHECK_CLOSE(r, naive_matmul(a, b), tol(dtype) * 10, tol(dtype) * 10);
  }
}

TEST_CASE("matmul: transposed / strided and broadcast operands", "[linalg]") {
  const auto backend = GENERATE(from_range(backends()));
  BackendScope scope(backend);
  const Tensor a = randn({5, 6}), b = randn({6, 4});
  const Tensor expected = naive_matmul(a, b);
  const Tensor wide = randn({5, 9});
  REQUIRE(wide.slice(1, 2, 8).stride(0) == 9);
  Tensor wide_view = wide.slice(1, 2, 8);  // rows 9 apart: a leading dimension > columns
  wide_view.copy_(a);
  const std::vector<std::pair<std::string, Tensor>> lefts = {
      {"transposed", transposed_copy(a)},  // contiguous columns: GEMM transposes
      {"strided", strided_copy(a)},        // no unit stride: copied
      {"column slice", wide_view},
  };
  for (const auto& [what, left] : lefts) {
    INFO(what);
    KILN_CHECK_CLOSE(matmul(left, b), expected, kF32, kF32);
    KILN_CHECK_CLOSE(matmul(left, transposed_copy(b)), expected, kF32, kF32);
    KILN_CHECK_CLOSE(matmul(left, strided_copy(b)), expected, kF32, kF32);
  }
  // a.t() of a contiguous tensor, a row of a transposed matrix, an expanded vector
  const Tensor at_ = randn({6, 5});
  KILN_CHECK_CLOSE(matmul(at_.t(), b), naive_matmul(at_.t(), b), kF32, kF32);
  const Tensor row = transposed_copy(a).slice(0, 1, 2);
  KILN_CHECK_CLOSE(matmul(row, b), naive_matmul(row, b), kF32, kF32);
  const Tensor col = randn({1, 6}).expand({5, 6});  // stride 0 rows: copied
  KILN_CHECK_CLOSE(matmul(col, b), naive_matmul(col, b), kF32, kF32);
  // batched: transposed stacks, a stack broadcast with stride 0, a permuted stack
  const Tensor sa = randn({3, 4, 5}), sb = randn({3, 5, 2});
  KILN_CHECK_CLOSE(matmul(transposed_copy(sa), sb), naive_matmul(sa, sb), kF32, kF32);
  KILN_CHECK_CLOSE(matmul(sa, transposed_copy(sb)), naive_matmul(sa, sb), kF32, kF32);
  KILN_CHECK_CLOSE(matmul(strided_copy(sa), strided_copy(sb)), naive_matmul(sa, sb), kF32, kF32);
  const Tensor one = randn({1, 4, 5}).expand({3, 4, 5});
  KILN_CHECK_CLOSE(matmul(one, sb), naive_matmul(one, sb), kF32, kF32);
  const Tensor perm = randn({4, 3, 5}).permute({1, 0, 2});  // batch stride < row stride
  KILN_CHECK_CLOSE(matmul(perm, sb), naive_matmul(perm, sb), kF32, kF32);
  const Tensor w = randn({5, 2});  // transposed stack @ shared matrix: no tall-GEMM folding
  KILN_CHECK_CLOSE(matmul(transposed_copy(sa), w), naive_matmul(sa, w), kF32, kF32);
}

TEST_CASE("matmul: the two GEMM backends agree", "[linalg]") {
  if (!cpu::gemm_blas_available()) {
    CHECK_THROWS_AS(cpu::set_gemm_backend(GemmBackend::blas), Error);
    return;
  }
  const Tensor a = randn({67, 45}, {.dtype = DType::f64}),
               b = randn({45, 31}, {.dtype = DType::f64});
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor l = ta ? transposed_copy(a) : a, r = tb ? transposed_copy(b) : b;
      Tensor with_blas, with_eigen;
      {
        BackendScope scope(GemmBackend::blas);
        with_blas = matmul(l, r);
      }
      {
        BackendScope scope(GemmBackend::eigen);
        with_eigen = matmul(l, r);
      }
      KILN_CHECK_CLOSE(with_blas, with_eigen, 1e-12, 1e-12);
      KILN_CHECK_CLOSE(with_blas, naive_matmul(a, b), 1e-12, 1e-12);
    }
  }
}

TEST_CASE("gemm: f32 products large enough for oneDNN, on every backend", "[linalg][gemm]") {
  const auto backend = GENERATE(from_range(backends()));
  BackendScope scope(backend);
  INFO(cpu::gemm_backend_name(backend));
  // 96 x 100 x 70 is past the 2^19 multiply-adds from which the dnnl backend calls oneDNN;
  // leading dimensions wider than the rows; alpha and beta as the primitive's output scale
  // and sum post-op. The others run in blocks on the dnnl backend (kernels/cpu/gemm.cpp):
  // more than 2048 columns, more than 16384 sums (the last block small enough for
  // OpenBLAS), more than 16384 rows (blocks where A is transposed) or columns.
  const auto [m, n, k] = GENERATE(std::tuple<int64_t, int64_t, int64_t>{96, 100, 70}, std::tuple{12, 2100, 24},
                                  std::tuple{6, 5, 17500}, std::tuple{16400, 6, 6}, std::tuple{2, 16400, 17});
  INFO("m " << m << " n " << n << " k " << k);
  const int64_t pad = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 0.25f}}) {
        INFO("trans_a " << ta << " trans_b " << tb << " alpha " << alpha << " beta " << beta);
        const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        auto random = [&](int64_t size) {
          std::vector<float> v(static_cast<size_t>(size));
          for (float& x : v) x = normal(rng);
          return v;
        };
        const std::vector<float> a = random((ta ? k : m) * lda), b = random((tb ? n : k) * ldb);
        std::vector<float> c = random(m * ldc);
        const std::vector<float> c0 = c;
        cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        // Any order of the k products, the scaling and the addition of beta C is within
        // gamma(k + 2) of the exact value relative to the magnitudes summed (tolerance.h).
        const double bound = sum_error_bound(k + 2);
        int64_t bad = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double exact = 0, magnitude = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double x = a[ta ? p * lda + i : i * lda + p], y = b[tb ? j * ldb + p : p * ldb + j];
              exact += x * y;
              magnitude += std::abs(x * y);
            }
            const double old = c0[i * ldc + j];
            exact = alpha * exact + beta * old;
            magnitude = std::abs(alpha) * magnitude + std::abs(beta * old);
            if (std::abs(c[i * ldc + j] - exact) > bound * magnitude) ++bad;
          }
        }
        CHECK(bad == 0);
        for (int64_t i = 0; i < m; ++i)  // the padding between rows is not written
          for (int64_t j = n; j < ldc; ++j) CHECK(c[i * ldc + j] == c0[i * ldc + j]);
      }
    }
  }
}

TEST_CASE("matmul: products large enough to thread inside the GEMM", "[linalg]") {
  const auto backend = GENERATE(from_range(backends()));
  BackendScope scope(backend);
  // One product per batch entry, each over 2^18 multiply-adds, fewer entries than threads
  // on most machines: the batch runs in order and each GEMM uses the threads.
  const Tensor a = randn({1, 70, 80}, {.dtype = DType::f64}).expand({2, 70, 80});
  const Tensor b = randn({2, 80, 60}, {.dtype = DType::f64});
  KILN_CHECK_CLOSE(matmul(a, b), naive_matmul(a, b), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(bmm(a, transposed_copy(b)), naive_matmul(a, b), 1e-12, 1e-12);
}

TEST_CASE("matmul: f16 and bf16 multiply in f32 and round once", "[linalg]") {
  const auto dtype = GENERATE(DType::f16, DType::bf16);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4}, {4}}, {{3, 4}, {4}}, {{3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 2}}};
  for (const auto& [sa, sb] : cases) {
    INFO(shape_str(sa) << " @ " << shape_str(sb) << " in " << name(dtype));
    const Tensor a = randn(sa).to(dtype), b = randn(sb).to(dtype);
    const Tensor r = matmul(a, b);
    CHECK(r.dtype() == dtype);
    // The reference sums the rounded inputs exactly; the result is rounded once more.
    KILN_CHECK_CLOSE(r, naive_matmul(a, b), tol(dtype), tol(dtype));
    KILN_CHECK_CLOSE(matmul(transposed_copy(a.dim() >= 2 ? a : a.unsqueeze(0)).squeeze(0), b),
                     naive_matmul(a, b), tol(dtype), tol(dtype));
  }
}

TEST_CASE("matmul: integer dtypes are exact", "[linalg]") {
  const auto dtype = GENERATE(DType::i64, DType::i32, DType::u8);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{5}, {5}}, {{3, 5}, {5, 4}}, {{2, 3, 5}, {5}}, {{2, 1, 3, 5}, {4, 5, 2}}};
  for (const auto& [sa, sb] : cases) {
    INFO(shape_str(sa) << " @ " << shape_str(sb) << " in " << name(dtype));
    const Tensor a = randint(0, 5, sa, {.dtype = dtype}), b = randint(0, 5, sb, {.dtype = dtype});
    const Tensor r = matmul(a, b);
    CHECK(r.dtype() == dtype);
    KILN_CHECK_EQUAL(r, naive_matmul(a, b));
    if (a.dim() >= 2)
      KILN_CHECK_EQUAL(matmul(transposed_copy(a), strided_copy(b)), naive_matmul(a, b));
  }
  // i32 wraps around on overflow, as two's complement arithmetic does.
  const Tensor big = full({1, 2}, int64_t{1} << 30, {.dtype = DType::i32});
  const Tensor two = full({2, 1}, 2, {.dtype = DType::i32});
  CHECK(matmul(big, two).item<int32_t>() == 0);  // 2^32 mod 2^32
}

TEST_CASE("mm and bmm", "[linalg]") {
  const Tensor a = randn({3, 4}), b = randn({4, 5});
  KILN_CHECK_CLOSE(mm(a, b), naive_matmul(a, b), kF32, kF32);
  KILN_CHECK_CLOSE(mm(transposed_copy(a), strided_copy(b)), naive_matmul(a, b), kF32, kF32);
  const Tensor sa = randn({4, 3, 2}), sb = randn({4, 2, 5});
  KILN_CHECK_CLOSE(bmm(sa, sb), naive_matmul(sa, sb), kF32, kF32);
  KILN_CHECK_CLOSE(bmm(transposed_copy(sa), transposed_copy(sb)), naive_matmul(sa, sb), kF32, kF32);
  KILN_CHECK_CLOSE(bmm(sa.to(DType::bf16), sb.to(DType::bf16)),
                   naive_matmul(sa.to(DType::bf16), sb.to(DType::bf16)), tol(DType::bf16),
                   tol(DType::bf16));
}

TEST_CASE("addmm: beta x bias + alpha x a @ b", "[linalg]") {
  const auto backend = GENERATE(from_range(backends()));
  BackendScope scope(backend);
  const auto dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::i64);
  const bool integral = is_integral(dtype);
  auto make = [&](Shape s) {
    return integral ? randint(-3, 4, s, {.dtype = dtype}) : randn(s).to(dtype);
  };
  const Tensor a = make({3, 4}), b = make({4, 5});
  const double t = tol(dtype) * 10;
  const Tensor ab = naive_matmul(a, b);
  for (const Shape& bias_shape : {Shape{3, 5}, Shape{5}, Shape{3, 1}, Shape{}}) {
    INFO("bias " << shape_str(bias_shape) << " in " << name(dtype));
    const Tensor bias = make(bias_shape);
    const Tensor bias64 = bias.to(DType::f64);
    KILN_CHECK_CLOSE(addmm(bias, a, b), ab + bias64, t, t);
    KILN_CHECK_CLOSE(addmm(bias, transposed_copy(a), strided_copy(b), 2, 3), ab * 3 + bias64 * 2, t,
                     t);
    CHECK(addmm(bias, a, b).dtype() == dtype);
  }
  if (!integral) {
    // beta == 0: the bias is not read, so NaNs in it vanish
    const Tensor nan_bias = full({5}, std::numeric_limits<double>::quiet_NaN(), {.dtype = dtype});
    KILN_CHECK_CLOSE(addmm(nan_bias, a, b, 0, 1), ab, t, t);
  }
}

TEST_CASE("matmul: bad operands throw errors naming the op and shapes", "[linalg]") {
  const Tensor a = zeros({2, 3}), b = zeros({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), "matmul: [2,3] @ [4,5]: inner sizes 3 and 4 differ");
  CHECK_THROWS_WITH(matmul(zeros({3}), zeros({4})),
                    "matmul: [3] @ [4]: inner sizes 3 and 4 differ");
  CHECK_THROWS_WITH(matmul(zeros({2, 3}), zeros({3, 4}, {.dtype = DType::f64})),
                    "matmul: f32[2,3] cpu @ f64[3,4] cpu: dtypes f32 and f64 differ");
  CHECK_THROWS_WITH(matmul(zeros({}), zeros({3})),
                    Catch::Contains("matmul: [] @ [3]") && Catch::Contains("0-d"));
  CHECK_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})),
                    Catch::Contains("matmul: [2,2,3] @ [3,3,4]") && Catch::Contains("broadcast"));
  CHECK_THROWS_WITH(
      matmul(zeros({2, 2}, {.dtype = DType::boolean}), zeros({2, 2}, {.dtype = DType::boolean})),
      Catch::Contains("matmul") && Catch::Contains("bool"));
  CHECK_THROWS_WITH(mm(zeros({2, 2, 3}), zeros({3, 4})),
                    Catch::Contains("mm: [2,2,3] @ [3,4]") && Catch::Contains("2-d"));
  CHECK_THROWS_WITH(mm(a, b), "mm: [2,3] @ [4,5]: inner sizes 3 and 4 differ");
  CHECK_THROWS_WITH(bmm(zeros({2, 2, 3}), zeros({3, 3, 4})),
                    "bmm: [2,2,3] @ [3,3,4]: batch sizes 2 and 3 differ");
  CHECK_THROWS_WITH(bmm(zeros({2, 3}), zeros({3, 4})),
                    Catch::Contains("bmm") && Catch::Contains("3-d"));
  CHECK_THROWS_WITH(addmm(zeros({4}), zeros({2, 3}), zeros({3, 5})),
                    Catch::Contains("addmm") && Catch::Contains("[4]"));
  CHECK_THROWS_WITH(addmm(zeros({5}), zeros({2, 3}), zeros({4, 5})),
                    "addmm: [2,3] @ [4,5]: inner sizes 3 and 4 differ");
  // Devices: checked by the rule before any memory is touched.
  const std::vector<TensorMeta> metas = {TensorMeta{{2, 3}, DType::f32, Device::cpu()},
                                         TensorMeta{{3, 4}, DType::f32, Device::cuda(0)}};
  CHECK_THROWS_WITH(find_op("matmul").infer(metas, {}),
                    "matmul: f32[2,3] cpu @ f32[3,4] cuda:0: devices cpu and cuda:0 differ");
  CHECK_THROWS_AS(find_op("mm").infer(metas, {}), Error);
}

TEST_CASE("matmul: the OpenBLAS kernels in use are named", "[linalg]") {
  const std::string kernels = cpu::gemm_blas_kernels();
  CHECK(kernels.empty() == !cpu::gemm_blas_available());
}
