#include "optim/sgd.h"

#include <algorithm>

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

// A group's update is one sgd_update_multi_ call through the registry (sgd_update_ for a
// lone parameter), reading the group's hyperparameter tensors, so that a traced step records
// one node per group (compiler/trace.h). A momentum buffer is made (zeros) on a parameter's
// first update and the call says so (`first`): a step traced then would bake that in, so
// compile a training step after one eager step. Parameters that differ in dtype, device or
// `first` go to separate calls (the multi op takes one kind); each parameter's numbers are
// the same either way. A skipped step (found_inf) still makes the buffers, as zeros: the
// next step then takes momentum * 0 + (1 - dampening) * g where PyTorch, which never ran the
// skipped step, takes g; the two agree unless dampening is set.
void SGD::step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, const std::vector<ParamState*>& states,
                     const Tensor& found_inf) {
  const SGDHyper hyper{group.hyper.at("lr"), group.hyper.at("momentum"), group.hyper.at("dampening"),
                       group.hyper.at("weight_decay"), found_inf};
  // Once a parameter has a momentum buffer it is used without reading momentum on the host,
  // so that a traced step holds for any momentum a schedule sets (no guard on its value).
  bool has_buffers = !params.empty();
  for (const ParamState* state : states) has_buffers = has_buffers && state->contains("momentum_buffer");
  const bool uses_momentum = has_buffers || group.get("momentum") != 0;
  struct Call {
    DType dtype;
    Device device;
    bool first;
    std::vector<Tensor> params, grads, buffers;
  };
  std::vector<Call> calls;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor buf;
    bool first = false;
    if (uses_momentum) {
      auto it = states[i]->find("momentum_buffer");
      first = it == states[i]->end();
      // In the parameter's memory order (channels_last after Module::to): the update's
      // loop walks them alike.
      if (first) buf = (*states[i])["momentum_buffer"] = zeros_like(p).contiguous(p.suggest_memory_format());
      else buf = it->second;
    }
    auto call = std::find_if(calls.begin(), calls.end(), [&](const Call& c) {
      return c.dtype == p.dtype() && c.device == p.device() && c.first == first;
    });
    if (call == calls.end()) call = calls.insert(calls.end(), Call{p.dtype(), p.device(), first, {}, {}, {}});
    call->params.push_back(p);
    call->grads.push_back(grads[i]);
    if (uses_momentum) call->buffers.push_back(buf);
  }
  for (const Call& c : calls) {
    const SGDFlags flags{group.get("nesterov") != 0, group.get("maximize") != 0, c.first};
    if (c.params.size() == 1)
      sgd_update_(c.params[0], c.grads[0], uses_momentum ? c.buffers[0] : Tensor(), hyper, flags);
    else
      sgd_update_multi_(c.params, c.grads, c.buffers, hyper, flags);
  }
}

}  // namespace kiln::optim
