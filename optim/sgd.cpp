#include "optim/sgd.h"

#include "core/error.h"
#include "core/ops/factory.h"
#include "core/ops/optim_ops.h"

namespace kiln::optim {

namespace {
std::map<std::string, double> sgd_defaults(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

}  // namespace

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options)
    : SGD(std::vector<ParamGroupSpec>{{params, {}}}, options) {}

SGD::SGD(const std::vector<ParamGroupSpec>& groups, SGDOptions options)
    : Optimizer("SGD", sgd_defaults(options)) {
  for (const auto& group : groups) add_param_group(group);
}

void SGD::check_group(const ParamGroup& group) const {
  KILN_CHECK(group.lr() >= 0, "SGD: invalid lr {}", group.lr());
  KILN_CHECK(group.get("momentum") >= 0, "SGD: invalid momentum {}", group.get("momentum"));
  KILN_CHECK(group.weight_decay() >= 0, "SGD: invalid weight_decay {}", group.weight_decay());
  if (group.get("nesterov") != 0)
    KILN_CHECK(group.get("momentum") > 0 && group.get("dampening") == 0,
               "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})",
               group.get("momentum"), group.get("dampening"));
}

// Each parameter's update is one sgd_update_ call through the registry, reading the group's
// hyperparameter tensors, so that a traced step records it (compiler/trace.h). A momentum
// buffer is made (zeros) on a parameter's first update and the call says so (`first`): a
// step traced then would bake that in, so compile a training step after one eager step.
void SGD::step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, const std::vector<ParamState*>& states) {
  const SGDHyper hyper{group.hyper.at("lr"), group.hyper.at("momentum"),
                       group.hyper.at("dampening"), group.hyper.at("weight_decay")};
  const bool uses_momentum = group.get("momentum") != 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor buf;
    SGDFlags flags{group.get("nesterov") != 0, group.get("maximize") != 0, false};
    if (uses_momentum) {
      auto it = states[i]->find("momentum_buffer");
      flags.first = it == states[i]->end();
      if (flags.first) buf = (*states[i])["momentum_buffer"] = zeros_like(p);
      else buf = it->second;
    }
    sgd_update_(p, grads[i], buf, hyper, flags);
  }
}

}  // namespace kiln::optim
