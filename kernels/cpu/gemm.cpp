// The CPU GEMM: OpenBLAS's cblas_?gemm when built in, Eigen's product of mapped matrices
// otherwise (or when selected at run time).
#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <climits>

#include "core/error.h"

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

std::atomic<GemmBackend> g_backend{kHaveBlas ? GemmBackend::blas : GemmBackend::eigen};

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
#ifdef KILN_HAVE_OPENBLAS
  const bool fits_int = std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX;
  if (g_backend.load(std::memory_order_relaxed) == GemmBackend::blas && fits_int) {
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
  g_backend.store(backend);
}

GemmBackend gemm_backend() { return g_backend.load(); }

bool gemm_blas_available() { return kHaveBlas; }

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
