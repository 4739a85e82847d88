#pragma once
// Gradient clipping, as torch.nn.utils.clip_grad_norm_.
#include <vector>

#include "core/tensor.h"

namespace kiln::optim {

// The norm of all gradients of `params` taken together (norm_type 2, 1, any p > 0, or
// infinity for the largest magnitude); parameters without a gradient are skipped. When the
// norm exceeds max_norm every gradient is scaled in place by max_norm / (norm + 1e-6).
// Returns the norm before scaling (0 with no gradients).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace kiln::optim
