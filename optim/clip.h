#pragma once
// Gradient clipping, as torch.nn.utils.clip_grad_norm_.
#include <vector>

#include "core/tensor.h"

namespace kiln::optim {

// The norm of all gradients of `params` taken together (norm_type 2, 1, any p > 0, or
// infinity for the largest magnitude); parameters without a gradient are skipped. Every
// gradient is then multiplied in place by min(1, max_norm / (norm + 1e-6)), so gradients
// whose norm is under max_norm keep their values exactly. Returns the norm before scaling,
// a 0-d f64 tensor on the gradients' device (0 with no gradients).
//
// All of it is tensor ops on the gradients' device, as PyTorch's: nothing is read back on
// the host, so it runs on CUDA gradients without a synchronization and inside a compiled
// step as part of its graph. Gradients on more than one device are an error.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace kiln::optim
