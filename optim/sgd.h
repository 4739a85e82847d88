#pragma once
// SGD with momentum, dampening, Nesterov momentum, L2 weight decay and maximize, as
// torch.optim.SGD.
#include <vector>

#include "optim/optimizer.h"

namespace kiln::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

// Per parameter: g = grad (negated when maximize) + weight_decay * p; with momentum,
// buf = g on the first step and momentum * buf + (1 - dampening) * g after, and
// g = g + momentum * buf (nesterov) or buf; then p -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions options = {});
  SGD(const std::vector<ParamGroupSpec>& groups, SGDOptions options = {});

  // The hyperparameters the update kernels take as tensors (lr, momentum, dampening,
  // weight_decay): the ones move_hyperparameters can put on the device.
  static std::vector<std::string> tensor_hyperparameters() { return {"lr", "momentum", "dampening", "weight_decay"}; }

 protected:
  void step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                  const std::vector<Tensor>& grads,
                  const std::vector<ParamState*>& states, const Tensor& found_inf) override;
  void check_group(const ParamGroup& group) const override;
};

}  // namespace kiln::optim
