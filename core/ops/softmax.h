#pragma once
// Softmax and log-softmax along one dim, and the backward ops autograd/ builds their
// gradients from. Floating inputs only; f16 and bf16 compute in f32.
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace kiln {

// exp(x - max) / sum(exp(x - max)) along `dim` (negative counts from the end); a row of all
// -inf gives NaN, as in PyTorch. Integer inputs are an error unless `dtype` (a floating type)
// is given: x is then converted to it first, like torch.softmax(x, dim, dtype=...).
Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
// (x - max) - log(sum(exp(x - max))) along `dim`; `dtype` as for softmax.
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

// The gradient of softmax from its output: out * (grad_out - sum(grad_out * out, dim)).
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);
// The gradient of log_softmax from its output: grad_out - exp(out) * sum(grad_out, dim).
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);

}  // namespace kiln
