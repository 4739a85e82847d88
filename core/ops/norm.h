#pragma once
// Batch and layer normalization with PyTorch's semantics, and their gradients. Optional
// tensors are passed as undefined Tensors (`Tensor()` or `{}`). 16-bit float inputs
// compute in f32; the saved statistics are f32 for them (f64 for f64 inputs).
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct BatchNormResult {
  Tensor output;       // the input's shape and dtype
  Tensor save_mean;    // [C]: the mean the output was normalized with
  Tensor save_invstd;  // [C]: 1 / sqrt(var + eps) it was normalized with
};

struct RunningStats {
  Tensor mean;  // [C]
  Tensor var;   // [C]
};

struct NormGrads {
  Tensor grad_input;
  Tensor grad_weight;  // the weight's shape (and dtype, when a weight was given)
  Tensor grad_bias;
};

struct LayerNormResult {
  Tensor output;
  Tensor mean;  // the input's leading dims, then a 1 per normalized dim
  Tensor rstd;  // 1 / sqrt(var + eps), shaped as mean
};

// Normalizes [N,C], [N,C,L] or [N,C,H,W] (any [N,C,...]) per channel C. In training it uses
// the batch's statistics and, when running statistics are given, updates them in place:
// r = (1 - momentum) r + momentum s, with the unbiased variance for running_var. In eval it
// uses the running statistics, which are then required.
BatchNormResult batch_norm_with_stats(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      bool training, double momentum = 0.1, double eps = 1e-5);
// batch_norm_with_stats's output alone.
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);
// The running statistics after a training-mode batch_norm of `input`: the values
// batch_norm_with_stats(input, ..., running_mean, running_var, true, momentum) writes into
// them in place (bit for bit: the batch statistics are recomputed the same way), returned
// as new tensors of the running statistics' dtypes; the arguments are left unchanged.
// Records no autograd graph.
RunningStats batch_norm_stats_update(const Tensor& input, const Tensor& running_mean,
                                     const Tensor& running_var, double momentum = 0.1);
// The gradients of batch_norm given the statistics it saved; `training` says whether they
// were the batch's (which then depend on the input) or the running ones.
NormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training,
                              double eps = 1e-5);

// Normalizes over the trailing dims `normalized_shape` (biased variance), then scales and
// shifts by weight and bias (shaped normalized_shape) when given.
LayerNormResult layer_norm_with_stats(const Tensor& input, std::vector<int64_t> normalized_shape,
                                      const Tensor& weight = {}, const Tensor& bias = {},
                                      double eps = 1e-5);
// layer_norm_with_stats's output alone.
Tensor layer_norm(const Tensor& input, std::vector<int64_t> normalized_shape,
                  const Tensor& weight = {}, const Tensor& bias = {}, double eps = 1e-5);
// The gradients of layer_norm given the statistics it saved.
NormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                              std::vector<int64_t> normalized_shape, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight = {});

}  // namespace kiln
