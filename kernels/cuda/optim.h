#pragma once
// The multi-tensor SGD update on CUDA: a group's parameters in a few launches, up to
// kSgdGroup parameters each, instead of one launch per parameter (compiler/eager_cuda.cpp
// runs sgd_update_multi{,_} through it). No CUDA header here.
#include <span>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln::cuda {

inline constexpr int kSgdGroup = 24;

// sgd_update_multi's inputs (param x N, grad x N, momentum_buffer x N?, lr, momentum,
// dampening, weight_decay) and where parameter k's results go (p_out[k], and buf_out[k]
// when buffers are given; the inputs themselves for the in-place form). Computes what the
// CPU kernel (kernels/cpu/optim_ops.cpp) computes, element for element. The kernel reads
// the hyperparameters from device memory: hyperparameters that live on the GPU are never
// read on the host (the launches may be captured in a CUDA graph); host ones are copied
// once per distinct set of values.
//
// Returns false, having done nothing, unless the parameters are f32 or f64 and each
// parameter's tensors share one dense layout (contiguous or channels_last, the same
// strides): the caller then runs the single-parameter kernels.
bool sgd_update_multi_tensor(std::span<const Tensor> in, std::span<const Tensor> p_out,
                             std::span<const Tensor> buf_out, const Attrs& attrs);

}  // namespace kiln::cuda
