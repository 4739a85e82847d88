#pragma once
// The optimizer updates on CUDA: a group's parameters in a few launches, up to kSgdGroup
// (kAdamGroup) parameters each, instead of one launch per parameter. optim.cpp registers the
// CUDA kernels of sgd_update{,_}, adamw_update{,_} and their multi forms on these: a single
// update is a group of one. The element arithmetic is kernels/scalar.h's sgd_update and
// adamw_update, the per-step factors kernels/optim_factors.h's, as in the CPU kernels. No
// CUDA header here.
#include <array>
#include <span>
#include <vector>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln::cuda {

inline constexpr int kSgdGroup = 24;
inline constexpr int kAdamGroup = 16;

// sgd_update_multi's inputs (param x N, grad x N, momentum_buffer x N?, lr, momentum,
// dampening, weight_decay: 0-d tensors on the host or the device) and where parameter k's
// results go (p_out[k], and buf_out[k] when buffers are given; the inputs themselves for
// the in-place form).
// Updates every f32 or f64 parameter whose tensors lie in one dense memory order
// (contiguous or channels_last, the same strides), computing what the CPU kernel
// (kernels/cpu/optim_ops.cpp) computes, bit for bit, and returns the indices of the others,
// which the caller updates on contiguous copies of their tensors.
std::vector<int64_t> sgd_update_multi_tensor(std::span<const Tensor> in, std::span<const Tensor> p_out,
                                             std::span<const Tensor> buf_out, const Attrs& attrs);

// Where adamw_update_multi_tensor computes each parameter's factors (kernels/scalar.h's
// adamw_factors, in f64): on the host, reading the step counts and hyperparameters there
// (the eager default), or on the device, in one small kernel per launch of kAdamGroup
// parameters that reads them where they are, so that nothing waits on the device and a
// captured CUDA graph replays each step's counts and lr (capturable AdamW). `automatic`:
// on the device when any step count or hyperparameter is a device tensor. The emulator's
// tests ask for `device` with CPU tensors to run that kernel.
enum class AdamWFactorsOn { automatic, host, device };

// The same for adamw_update_multi's inputs (param x N, grad x N, exp_avg x N, exp_avg_sq x
// N, max_exp_avg_sq x N?, step x N, lr, beta1, beta2, eps, weight_decay) into out = (new
// params, new exp_avgs, new exp_avg_sqs, new max_exp_avg_sqs: empty without amsgrad), up
// to kAdamGroup parameters a launch, each with the factors of its own step count.
std::vector<int64_t> adamw_update_multi_tensor(std::span<const Tensor> in, const std::array<std::span<const Tensor>, 4>& out,
                                               const Attrs& attrs, AdamWFactorsOn where = AdamWFactorsOn::automatic);

}  // namespace kiln::cuda
