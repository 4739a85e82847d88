#pragma once
// gradcheck: compares the gradients backward computes with finite differences, in f64.
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
  uint64_t seed = 0;   // for the random output cotangent
};

// fn maps the inputs to one output. Inputs that require grad must be f64 and must not
// have elements that share memory. Checks v^T J for a random v against central
// differences of sum(v * fn(x)) for every element of every such input; returns true, or
// throws kiln::Error naming the input, the element and both values.
bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
               const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace kiln
