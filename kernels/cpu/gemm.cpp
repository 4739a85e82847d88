// The CPU GEMM: oneDNN's matmul for large f32 products, OpenBLAS's cblas_?gemm when built
// in, Eigen's product of mapped matrices otherwise (or when selected at run time).
#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/cpu/gemm_dnnl.h"

#ifdef KILN_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace kiln::cpu {
namespace {

#ifdef KILN_HAVE_OPENBLAS
constexpr bool kHaveBlas = true;
#else
constexpr bool kHaveBlas = false;
#endif

// KILN_GEMM_BACKEND=dnnl|blas|eigen picks one (when this build and CPU have it), as
// KILN_CONV_BACKEND does for convolutions; otherwise the fastest there is.
GemmBackend default_backend() {
  const bool dnnl = !dnnl_f32_gemm_implementation().empty();
  if (const char* v = std::getenv("KILN_GEMM_BACKEND"); v && *v && std::strcmp(v, "auto") != 0) {
    if (std::strcmp(v, "dnnl") == 0 && dnnl) return GemmBackend::dnnl;
    if (std::strcmp(v, "blas") == 0 && kHaveBlas) return GemmBackend::blas;
    if (std::strcmp(v, "eigen") == 0) return GemmBackend::eigen;
    std::fprintf(stderr, "kiln: KILN_GEMM_BACKEND=%s: expected auto or one this build has (%s%seigen); using auto\n",
                 v, dnnl ? "dnnl, " : "", kHaveBlas ? "blas, " : "");
  }
  if (dnnl) return GemmBackend::dnnl;
  return kHaveBlas ? GemmBackend::blas : GemmBackend::eigen;
}

// The backend set by set_gemm_backend, or kUnset: the default, probed at the first product
// rather than as the library loads.
constexpr uint8_t kUnset = 0xff;
std::atomic<uint8_t> g_backend{kUnset};

GemmBackend current_backend() {
  const uint8_t set = g_backend.load(std::memory_order_relaxed);
  if (set != kUnset) return static_cast<GemmBackend>(set);
  static const GemmBackend fallback = default_backend();
  return fallback;
}

// Below this many multiply-adds OpenBLAS's f32 GEMM starts faster than oneDNN's (64x128x64:
// 224 against 198 GFLOP/s on two threads; 96^3: 201 against 271).
constexpr int64_t kDnnlMinWork = int64_t{1} << 19;

template <class T>
void eigen_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  const Eigen::Map<const Matrix, Eigen::Unaligned, Stride> A(a, trans_a ? k : m, trans_a ? m : k,
                                                             Stride(lda));
  const Eigen::Map<const Matrix, Eigen::Unaligned, Stride> B(b, trans_b ? n : k, trans_b ? k : n,
                                                             Stride(ldb));
  Eigen::Map<Matrix, Eigen::Unaligned, Stride> C(c, m, n, Stride(ldc));
  auto product = [&](const auto& op_a, const auto& op_b) {
    if (beta == T(0)) {
      C.noalias() = alpha * op_a * op_b;
      return;
    }
    if (beta != T(1)) C *= beta;
    C.noalias() += alpha * op_a * op_b;
  };
  if (!trans_a && !trans_b)
    product(A, B);
  else if (trans_a && !trans_b)
    product(A.transpose(), B);
  else if (!trans_a && trans_b)
    product(A, B.transpose());
  else
    product(A.transpose(), B.transpose());
}

#ifdef KILN_HAVE_OPENBLAS
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c,
               int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

template <class T>
void library_gemm(GemmBackend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// oneDNN 2.6's f32 matmul slows down on some large shapes, measured on two threads here
// (docs/design-notes.md, "oneDNN's large products in blocks"): with B not transposed and
// more than 2048 columns (GPT-2's 768 -> 3072 layer and its weight gradient: 114-129
// GFLOP/s, 300 in blocks of 1024 columns), with more than 16384 sums (the vocabulary
// head's input gradient: 215 against 283 in blocks of 8192 added up) and with A
// transposed and more than 16384 rows (the head's weight gradient: 189 against 305 in
// blocks of 8192 rows). So those products run as several calls; blocks of rows or
// columns are independent products, blocks of the sum add into C (beta 1 after the first).
constexpr int64_t kDnnlColumnBlock = 1024, kDnnlMaxColumns = 2048;
constexpr int64_t kDnnlBigBlock = 8192, kDnnlMaxBig = 16384;

// One block, through oneDNN where it has a kernel for its strides and OpenBLAS or Eigen
// where it has none.
void dnnl_block(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m * n * k > kDnnlMinWork && dnnl_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  library_gemm(current_backend(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dnnl_blocks(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t column_block = !trans_b && n > kDnnlMaxColumns ? kDnnlColumnBlock
                               : n > kDnnlMaxBig                 ? kDnnlBigBlock
                                                                 : n;
  const int64_t row_block = trans_a && m > kDnnlMaxBig ? kDnnlBigBlock : m;
  const int64_t sum_block = k > kDnnlMaxBig ? kDnnlBigBlock : k;
  for (int64_t i = 0; i < m; i += row_block)
    for (int64_t j = 0; j < n; j += column_block)
      for (int64_t l = 0; l < k; l += sum_block) {
        const float* ab = a + (trans_a ? l * lda + i : i * lda + l);
        const float* bb = b + (trans_b ? j * ldb + l : l * ldb + j);
        dnnl_block(trans_a, trans_b, std::min(row_block, m - i), std::min(column_block, n - j),
                   std::min(sum_block, k - l), alpha, ab, lda, bb, ldb, l == 0 ? beta : 1.0f, c + i * ldc + j, ldc);
      }
}

template <class T>
void gemm_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m={} n={} k={}", m, n, k);
  // A wrong leading dimension would make BLAS print a message and return garbage.
  KILN_CHECK(lda >= std::max<int64_t>(1, trans_a ? m : k) &&
                 ldb >= std::max<int64_t>(1, trans_b ? k : n) && ldc >= std::max<int64_t>(1, n),
             "gemm: leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={} "
             "(trans_a={}, trans_b={})",
             lda, ldb, ldc, m, n, k, trans_a, trans_b);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: libraries disagree on whether they still scale C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  const GemmBackend backend = current_backend();
  if constexpr (std::is_same_v<T, float>) {
    if (backend == GemmBackend::dnnl && m * n * k > kDnnlMinWork) {
      dnnl_blocks(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  library_gemm(backend, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void library_gemm(GemmBackend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
#ifdef KILN_HAVE_OPENBLAS
  const bool fits_int = std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX;
  if (backend != GemmBackend::eigen && fits_int) {
    blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    return;
  }
#endif
  eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void set_gemm_backend(GemmBackend backend) {
  KILN_CHECK(backend != GemmBackend::blas || kHaveBlas,
             "set_gemm_backend: this build of kiln has no OpenBLAS (configure with KILN_BLAS=ON "
             "after installing libopenblas-openmp-dev)");
  KILN_CHECK(backend != GemmBackend::dnnl || gemm_dnnl_available(),
             "set_gemm_backend: oneDNN's f32 matmul is not available here (a build without "
             "libdnnl-dev, or DNNL_MAX_CPU_ISA allows no JIT kernel)");
  g_backend.store(static_cast<uint8_t>(backend));
}

GemmBackend gemm_backend() { return current_backend(); }

bool gemm_blas_available() { return kHaveBlas; }

bool gemm_dnnl_available() { return !dnnl_f32_gemm_implementation().empty(); }

std::vector<GemmBackend> gemm_backends() {
  std::vector<GemmBackend> all;
  if (gemm_dnnl_available()) all.push_back(GemmBackend::dnnl);
  if (kHaveBlas) all.push_back(GemmBackend::blas);
  all.push_back(GemmBackend::eigen);
  return all;
}

const char* gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::dnnl: return "onednn";
    case GemmBackend::blas: return "openblas";
    default: return "eigen";
  }
}

std::string gemm_blas_kernels() {
#ifdef KILN_HAVE_OPENBLAS
  return openblas_get_corename();
#else
  return "";
#endif
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace kiln::cpu
