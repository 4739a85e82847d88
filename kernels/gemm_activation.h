#pragma once
// addmm_activation and mm_gelu_backward (core/ops/linalg.h) as the chain of ops they stand
// for, on any device: the CPU's kernels, and CUDA's where cuBLASLt offers no algorithm for
// the epilogue (kernels/cuda/matmul.cpp).
#include <span>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln {

// in: (bias, a, b); out: (out) for "relu", (out, pre) for "gelu_tanh".
void addmm_activation_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs);
// in: (g, w, pre); out: (grad_pre, grad_bias).
void mm_gelu_backward_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs);

}  // namespace kiln
