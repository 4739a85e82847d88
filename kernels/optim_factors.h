#pragma once
// The per-step factors of the optimizer updates, written once for the CPU and the CUDA
// kernels: computed from the ops' hyperparameters on the host, in f64 as PyTorch computes
// them in Python. The element updates that use them, rounded to the parameter's dtype
// (scalar::in_dtype), are kernels/scalar.h's sgd_update and adamw_update. Host only.
#include <span>

#include "core/registry.h"
#include "core/tensor.h"
#include "kernels/scalar.h"

namespace kiln {

// hyper: the update's lr, momentum, dampening and weight_decay (0-d host tensors); attrs:
// its nesterov, maximize and first flags.
inline scalar::SgdFactors<double> sgd_factors(std::span<const Tensor> hyper, const Attrs& attrs) {
  const double lr = hyper[0].item<double>(), momentum = hyper[1].item<double>(),
               dampening = hyper[2].item<double>(), weight_decay = hyper[3].item<double>();
  return {lr, momentum, 1.0 - dampening, weight_decay, weight_decay != 0,
          attrs.b("nesterov"), attrs.b("maximize"), attrs.b("first")};
}

// step: the parameter's step count, this step included (0-d host tensor); hyper: lr, beta1,
// beta2, eps and weight_decay (0-d host tensors); attrs: the maximize flag.
inline scalar::AdamWFactors<double> adamw_factors(const Tensor& step_count, std::span<const Tensor> hyper,
                                                  const Attrs& attrs) {
  return scalar::adamw_factors(step_count.item<double>(), hyper[0].item<double>(), hyper[1].item<double>(),
                               hyper[2].item<double>(), hyper[3].item<double>(), hyper[4].item<double>(),
                               attrs.b("maximize"));
}

}  // namespace kiln
