#pragma once
// AdamW (Adam with decoupled weight decay) with amsgrad and maximize, as torch.optim.AdamW.
#include <vector>

#include "optim/optimizer.h"

namespace kiln::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;  // torch's betas[0]
  double beta2 = 0.999;  // torch's betas[1]
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

// Per parameter, with t the parameter's step count (state "step", starting at 1):
// p *= 1 - lr * weight_decay; m = m + (1 - beta1) (g - m); v = beta2 v + (1 - beta2) g^2;
// (amsgrad: vmax = max(vmax, v) is used for v); p -= lr / (1 - beta1^t) * m /
// (sqrt(v) / sqrt(1 - beta2^t) + eps). State: "step", "exp_avg", "exp_avg_sq",
// "max_exp_avg_sq".
class AdamW : public Optimizer {
 public:
  AdamW(const std::vector<Tensor>& params, AdamWOptions options = {});
  AdamW(const std::vector<ParamGroupSpec>& groups, AdamWOptions options = {});

 protected:
  void step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                  const std::vector<Tensor>& grads,
                  const std::vector<ParamState*>& states, const Tensor& found_inf) override;
  void check_group(const ParamGroup& group) const override;
};

}  // namespace kiln::optim
