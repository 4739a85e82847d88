#pragma once
// The one CPU GEMM every kiln kernel multiplies matrices with. Matrices are row-major: the
// element (i, j) of a stored matrix with leading dimension ld is at p[i * ld + j].
// oneDNN's matmul does the f32 work where kiln was built with it, OpenBLAS the rest (and
// all of it without oneDNN), Eigen where neither is built in; each uses the OpenMP threads
// when called outside a parallel region and one thread inside one.
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {
struct BFloat16;
struct Half;
}  // namespace kiln

namespace kiln::cpu {

// `dnnl`: f32 products of more than 2^19 multiply-adds through oneDNN's matmul
// (kernels/cpu/gemm_dnnl.h: its AVX-512 kernels beat OpenBLAS's, most on the tall and thin
// products of convolutions), smaller ones and f64 through OpenBLAS (Eigen without it),
// which start faster; `blas`: OpenBLAS for all; `eigen`: Eigen's product for all.
enum class GemmBackend : uint8_t { blas, eigen, dnnl };

// Selects the library gemm calls from now on (for every thread); choosing one this build
// (or, for dnnl, this CPU) lacks is a kiln::Error.
void set_gemm_backend(GemmBackend backend);
// The library gemm calls now: by default dnnl where oneDNN has a JIT f32 matmul here,
// else blas where it was built in, else eigen; KILN_GEMM_BACKEND=auto|dnnl|blas|eigen in
// the environment overrides the default.
GemmBackend gemm_backend();
// Whether this build has OpenBLAS; whether this build and CPU run oneDNN's f32 matmul.
bool gemm_blas_available();
bool gemm_dnnl_available();
// The backends this build and CPU can run, and a backend's name ("onednn", "openblas",
// "eigen").
std::vector<GemmBackend> gemm_backends();
const char* gemm_backend_name(GemmBackend backend);

// The OpenBLAS kernels GEMM runs ("Haswell", "SkylakeX", ...; "" without OpenBLAS). A
// DYNAMIC_ARCH OpenBLAS picks them per CPU as it loads, unless OPENBLAS_CORETYPE names
// them: on the AVX-512 machines here it picks Cooperlake, and OPENBLAS_CORETYPE=Haswell
// (AVX2) makes ResNet-50's CPU training step 1.2-1.3x slower. kiln-bench prints it, since
// figures from two machines compare only when they ran the same kernels.
std::string gemm_blas_kernels();

// C = alpha * op(A) op(B) + beta * C, where op(A) is m x k and op(B) is k x n. A is stored
// m x k (k x m when trans_a, and op(A) is its transpose) with rows lda elements apart; B
// likewise with ldb; C is m x n with rows ldc apart. With beta == 0 C is only written, so
// it may hold garbage. Leading dimensions must be at least the stored row length (and 1).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// The same product of 16-bit float operands, summed in f32 into an f32 C, so that a caller
// rounds each result once (kernels/cpu/gemm_reduced.cpp). bf16 runs on AMX through oneDNN
// or on AVX-512 BF16's dot-product instructions where the CPU has them (see
// Bf16GemmPath); f16, and bf16 elsewhere, are converted to f32 a block of k at a time for
// the f32 GEMM above.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Half* a,
          int64_t lda, const Half* b, int64_t ldb, float beta, float* c, int64_t ldc);

// How bf16 GEMMs run: `dnnl` through oneDNN's matmul (kernels/cpu/gemm_dnnl.h: AMX tiles
// where the CPU has them), falling back to `dot` or `convert` for a call it has no kernel
// for; `dot` packs the operands into bf16 pairs for vdpbf16ps (f32 sums; like all AVX-512
// BF16 and AMX arithmetic it flushes subnormal inputs and results to zero); `convert`
// converts them to f32 for the f32 GEMM. The default is dnnl where oneDNN runs AMX here
// (5-7x dot), else dot where the CPU has AVX-512 BF16, else convert; selecting a path the
// build or the CPU lacks is a kiln::Error.
enum class Bf16GemmPath : uint8_t { dot, convert, dnnl };
void set_bf16_gemm_path(Bf16GemmPath path);
Bf16GemmPath bf16_gemm_path();
// The paths this build and CPU can run, and a path's name: "dnnl", "dot" or "convert".
std::vector<Bf16GemmPath> bf16_gemm_paths();
const char* bf16_gemm_path_name(Bf16GemmPath path);
// Whether this CPU (and its OS) runs AVX-512 BF16 instructions.
bool cpu_has_avx512_bf16();

}  // namespace kiln::cpu
