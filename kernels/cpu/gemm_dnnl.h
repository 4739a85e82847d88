#pragma once
// GEMMs through oneDNN's matmul primitive: bf16 (Bf16GemmPath::dnnl) and f32
// (GemmBackend::dnnl), kernels/cpu/gemm.h.
// - bf16: on CPUs with AMX, oneDNN 2.6's brgemm matmul multiplies bf16 tiles in the AMX
//   units at 5-7x the speed of the AVX-512 BF16 GEMM in gemm_reduced.cpp (and 4x OpenBLAS's
//   f32 GEMM); without AMX it is as fast as that GEMM, no faster.
// - f32: oneDNN's brgemm kernels use AVX-512 wherever the CPU has it, whatever
//   OPENBLAS_CORETYPE says, and block the tall-and-thin products of convolutions and
//   linear layers better than OpenBLAS: 1.0-1.1x OpenBLAS's AVX-512 kernels on square
//   products, 1.4-2.2x on im2col shapes (tools: kiln-bench ops, docs/design-notes.md).
#include <cstdint>
#include <string>

#include "core/half.h"

namespace kiln::cpu {

// The implementation oneDNN runs bf16 (f32) matmuls with on this CPU
// ("brg:avx512_core_amx_bf16", "brg:avx512_core", ...), probed once; "" where the build has
// no oneDNN or oneDNN has only its reference implementation (or DNNL_MAX_CPU_ISA forbids
// the JIT ones).
const std::string& dnnl_bf16_gemm_implementation();
const std::string& dnnl_f32_gemm_implementation();

// C = alpha op(A) op(B) + beta C as gemm() in gemm.h defines it, through a matmul primitive
// made once per dtype, shape, strides, alpha and beta and kept. False, having done nothing,
// where oneDNN has no JIT kernel for the call; the caller then runs its own GEMM.
bool dnnl_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
               int64_t ldc);
bool dnnl_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace kiln::cpu
