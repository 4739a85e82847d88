#include "optim/adamw.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/optim_ops.h"

namespace kiln::optim {

namespace {
std::map<std::string, double> adamw_defaults(const AdamWOptions& o) {
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

// The state tensor `name` of a parameter, zeros like `p` when new, in its memory order
// (channels_last after Module::to): the update's loop walks them alike.
Tensor& state_tensor(ParamState& state, const std::string& name, const Tensor& p) {
  Tensor& t = state[name];
  if (!t.defined()) t = zeros_like(p).contiguous(p.suggest_memory_format());
  return t;
}
}  // namespace

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroupSpec>{{params, {}}}, options) {}

AdamW::AdamW(const std::vector<ParamGroupSpec>& groups, AdamWOptions options)
    : Optimizer("AdamW", adamw_defaults(options)), capturable_(options.capturable) {
  for (const auto& group : groups) add_param_group(group);
}

void AdamW::check_group(const ParamGroup& group) const {
  KILN_CHECK(group.lr() >= 0, "AdamW: invalid lr {}", group.lr());
  KILN_CHECK(group.get("eps") >= 0, "AdamW: invalid eps {}", group.get("eps"));
  for (const char* beta : {"beta1", "beta2"})
    KILN_CHECK(group.get(beta) >= 0 && group.get(beta) < 1, "AdamW: invalid {} {}", beta,
               group.get(beta));
  KILN_CHECK(group.weight_decay() >= 0, "AdamW: invalid weight_decay {}", group.weight_decay());
}

Device AdamW::state_device(const Tensor& param, const std::string& name, Device saved) const {
  return name == "step" ? step_device(param) : saved;
}

// Each parameter's step count is incremented by its own add_(1), then a group's update is
// one adamw_update_multi_ call through the registry (adamw_update_ for a lone parameter),
// all reading tensors (the states' "step", the group's hyperparameters), so that a traced
// step records them (compiler/trace.h) with the step counts and the bias corrections as
// runtime values, and one update node per group. Capturable, the step counts are device
// tensors, and so every tensor the ops read is where the update runs (the hyperparameters
// once moved): nothing here or in the CUDA kernels reads a value back to the host, and a
// CUDA graph can capture the step. State is made (zeros) on a parameter's first update: a
// step traced then would bake that in, so compile a training step after one eager step.
// Parameters that differ in dtype or device go to separate calls (the multi op takes one
// kind); each parameter's numbers are the same either way.
void AdamW::step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, const std::vector<ParamState*>& states,
                       const Tensor& found_inf) {
  const AdamWHyper hyper{group.hyper.at("lr"),  group.hyper.at("beta1"),        group.hyper.at("beta2"),
                         group.hyper.at("eps"), group.hyper.at("weight_decay"), found_inf};
  // A skipped step leaves the step counts as they were: each is bumped by 1 - found_inf, an
  // op (a traced step records it), where the counts live: on the host, for CUDA parameters
  // that reads found_inf back once per step; capturable, on the parameters' device, where
  // found_inf is (the GradScaler keeps it there), so nothing waits.
  std::vector<std::pair<Device, Tensor>> bumps;
  const auto bump_on = [&](Device device) -> const Tensor& {
    auto it = std::find_if(bumps.begin(), bumps.end(), [&](const auto& b) { return b.first == device; });
    if (it == bumps.end()) it = bumps.insert(bumps.end(), {device, 1.0 - found_inf.to(device).to(DType::f64)});
    return it->second;
  };
  const AdamWFlags flags{group.get("amsgrad") != 0, group.get("maximize") != 0};
  struct Call {
    DType dtype;
    Device device;
    std::vector<Tensor> params, grads;
    std::vector<AdamWState> states;
  };
  std::vector<Call> calls;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    ParamState& state = *states[i];
    Tensor& step = state["step"];
    if (!step.defined()) step = scalar_tensor(0.0, DType::f64, step_device(p));
    if (found_inf.defined()) step.add_(bump_on(step.device()));
    else step.add_(1);
    const AdamWState moments{state_tensor(state, "exp_avg", p), state_tensor(state, "exp_avg_sq", p),
                             flags.amsgrad ? state_tensor(state, "max_exp_avg_sq", p) : Tensor(),
                             step};
    auto call = std::find_if(calls.begin(), calls.end(),
                             [&](const Call& c) { return c.dtype == p.dtype() && c.device == p.device(); });
    if (call == calls.end()) call = calls.insert(calls.end(), Call{p.dtype(), p.device(), {}, {}, {}});
    call->params.push_back(p);
    call->grads.push_back(grads[i]);
    call->states.push_back(moments);
  }
  for (const Call& c : calls) {
    if (c.params.size() == 1)
      adamw_update_(c.params[0], c.grads[0], c.states[0], hyper, flags);
    else
      adamw_update_multi_(c.params, c.grads, c.states, hyper, flags);
  }
}

}  // namespace kiln::optim
