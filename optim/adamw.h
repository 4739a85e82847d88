#pragma once
// AdamW (Adam with decoupled weight decay) with amsgrad and maximize, as torch.optim.AdamW.
#include <string>
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
  // PyTorch's capturable: each parameter's step count ("step" state) is a 0-d f64 tensor on
  // the parameter's device, not the host, and is bumped there (step(found_inf) adds
  // 1 - found_inf), so the update reads nothing back to the host and a CUDA graph can
  // capture it (a traced step's; eager step() still validates the hyperparameters' values
  // on the host). On CUDA the update kernels then compute the factors on the device (one
  // small extra launch per kAdamGroup parameters, kernels/cuda/optim.h). For a captured
  // graph, also move the hyperparameters there: move_hyperparameters(
  // AdamW::tensor_hyperparameters(), device); left on the host, they are copied over at each
  // step. An option of the optimizer, not of its groups: a state dict carries no such flag,
  // and loads into either kind, the step counts going where the loading optimizer keeps them.
  bool capturable = false;
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

  // The hyperparameters the update kernels take as tensors (lr, beta1, beta2, eps,
  // weight_decay): the ones move_hyperparameters can put on the device.
  static std::vector<std::string> tensor_hyperparameters() { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }
  bool capturable() const { return capturable_; }

 protected:
  void step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                  const std::vector<Tensor>& grads,
                  const std::vector<ParamState*>& states, const Tensor& found_inf) override;
  void check_group(const ParamGroup& group) const override;
  Device state_device(const Tensor& param, const std::string& name, Device saved) const override;

 private:
  // Where `param`'s step count lives: its device when capturable, else the host.
  Device step_device(const Tensor& param) const { return capturable_ ? param.device() : Device::cpu(); }

  bool capturable_;
};

}  // namespace kiln::optim
