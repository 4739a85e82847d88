#pragma once
// Loss functions with PyTorch's semantics, and the backward ops autograd/ builds their
// gradients from. `reduction` is "none", "mean" or "sum" (anything else is an error).
//
// Class-index losses take log-probabilities or logits shaped [N, C], [N, C, d1, ...] or [C]
// and an i64 target shaped [N], [N, d1, ...] or []; the class dim is 1 (0 for [C]). A target
// equal to ignore_index adds nothing; any other target outside [0, C) is an error. "mean"
// divides by the summed class weight of the targets that are not ignored (their count
// without weights), so it is NaN when every target is ignored. A class weight is a [C]
// tensor of any floating dtype (PyTorch insists on the input's; kiln converts it). Losses
// accumulate in f64 and are returned in the input's dtype.
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace kiln {

struct NllLossOptions {
  Tensor weight{};  // [C]; undefined for none
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};

struct CrossEntropyOptions {
  Tensor weight{};  // [C]; undefined for none
  int64_t ignore_index = -100;
  std::string reduction = "mean";
  double label_smoothing = 0.0;  // in [0, 1]
};

// -weight[t] * log_probs[n, t, ...] for each target t = target[n, ...], then reduced.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options = {});

// Cross entropy of logits against class indices (an integer target) or class probabilities
// (a floating target shaped like the logits), with PyTorch's label smoothing. Class indices:
// (1 - ls) * nll_loss + ls / C * smooth, where smooth = -sum_c weight[c] * log_softmax[c] per
// element (0 where ignored), reduced like nll_loss ("mean" divides by the same summed
// weight). Probabilities: -sum_c weight[c] * target'[c] * log_softmax[c] with
// target' = target * (1 - ls) + ls / C; "mean" divides by the number of elements N * d1 * ...
// (ignore_index plays no part).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options = {});

// (input - target)^2, the operands broadcast as in PyTorch; "mean" divides by the number of
// elements of the broadcast shape. Floating results only.
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

// ---- ops behind cross_entropy, and backward ops ----

// cross_entropy with class indices, from log-probabilities (op "cross_entropy_loss").
Tensor cross_entropy_loss(const Tensor& log_probs, const Tensor& target,
                          const CrossEntropyOptions& options = {});
// cross_entropy with class probabilities, from log-probabilities (op
// "cross_entropy_prob_loss"); ignore_index is not used.
Tensor cross_entropy_prob_loss(const Tensor& log_probs, const Tensor& target_probs,
                               const CrossEntropyOptions& options = {});

// The gradient of nll_loss with respect to log_probs; grad_out is shaped like nll_loss's
// result.
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target,
                         const NllLossOptions& options = {});
// The gradient of cross_entropy_loss with respect to log_probs.
Tensor cross_entropy_loss_backward(const Tensor& grad_out, const Tensor& log_probs,
                                   const Tensor& target, const CrossEntropyOptions& options = {});
// The gradient of cross_entropy_prob_loss with respect to log_probs (not target_probs).
Tensor cross_entropy_prob_loss_backward(const Tensor& grad_out, const Tensor& log_probs,
                                        const Tensor& target_probs,
                                        const CrossEntropyOptions& options = {});
// The gradient of mse_loss with respect to input, in the broadcast shape:
// 2 * (input - target) * grad_out (divided by the element count for "mean").
Tensor mse_loss_backward(const Tensor& grad_out, const Tensor& input, const Tensor& target,
                         const std::string& reduction = "mean");

}  // namespace kiln
