#pragma once
// What kernels/cuda/matmul.cpp tells its tests.
#include <cstdint>

namespace kiln::cuda {

// How many addmm calls have added their bias in cuBLASLt's epilogue (the Linear case:
// a bias vector over the product's columns, beta 1) since the process started.
int64_t cublaslt_bias_epilogues();
// How many addmm_activation and mm_gelu_backward calls have run in cuBLASLt's epilogues
// (RELU_BIAS, GELU_AUX_BIAS, DGELU_BGRAD) rather than as the chain of ops.
int64_t cublaslt_activation_epilogues();

}  // namespace kiln::cuda
