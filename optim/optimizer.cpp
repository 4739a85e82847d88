#include "optim/optimizer.h"

#include <set>
#include <utility>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/factory.h"
#include "core/registry.h"

namespace kiln::optim {

double ParamGroup::get(const std::string& name) const {
  auto it = hyper.find(name);
  if (it == hyper.end()) {
    std::string known;
    for (const auto& [key, value] : hyper) known += (known.empty() ? "" : ", ") + key;
    fail("ParamGroup: no hyperparameter '{}' (this group has: {})", name, known);
  }
  return it->second.item<double>();
}

void ParamGroup::set(const std::string& name, double value) {
  // The error for an unknown name, without reading the value (on a device, a wait).
  if (!hyper.contains(name)) get(name);
  // An op, not a raw write: inside a compiled step a tracer records it (a write-back of the
  // hyperparameter), and a split run orders it after the deferred updates that read it.
  hyper.at(name).fill_(value);
}

Optimizer::Optimizer(std::string name, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::add_param_group(const ParamGroupSpec& spec) {
  for (const auto& [key, value] : spec.options)
    KILN_CHECK(defaults_.count(key), "{}: unknown hyperparameter '{}'", name_, key);
  std::set<const TensorImpl*> seen;
  for (const auto& group : groups_)
    for (const auto& p : group.params) seen.insert(p.impl());
  ParamGroup group;
  for (const auto& p : spec.params) {
    KILN_CHECK(p.defined(), "{}: a parameter is an undefined tensor", name_);
    KILN_CHECK(is_floating(p.dtype()), "{}: parameters must be floating, got {}", name_,
               p.meta_str());
    KILN_CHECK(p.is_leaf(), "{}: can't optimize a non-leaf tensor {}", name_, p.meta_str());
    KILN_CHECK(seen.insert(p.impl()).second,
               "{}: parameter {} appears in more than one group", name_, p.meta_str());
    group.params.push_back(p);
  }
  for (const auto& [key, value] : defaults_) {
    auto it = spec.options.find(key);
    group.hyper[key] = scalar_tensor(it == spec.options.end() ? value : it->second, DType::f64);
  }
  check_group(group);
  groups_.push_back(std::move(group));
}

void Optimizer::move_hyperparameters(const std::vector<std::string>& names, Device device) {
  for (ParamGroup& group : groups_)
    for (const std::string& name : names) {
      group.get(name);  // the error for an unknown name
      group.hyper[name] = group.hyper[name].to(device);
    }
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& group : groups_)
    for (const auto& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        p.set_grad({});
      } else {
        g.detach().zero_();  // in place, so views of the gradient see zeros too
      }
    }
}

ParamState& Optimizer::state(const Tensor& param) { return state_[param.impl()]; }

bool Optimizer::has_state(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it != state_.end() && !it->second.empty();
}

void Optimizer::step() { step(Tensor()); }

void Optimizer::step(const Tensor& found_inf) {
  if (found_inf.defined())
    KILN_CHECK(found_inf.dim() == 0 && found_inf.dtype() == DType::f32,
               "{}.step: found_inf must be a 0-d f32 tensor, got {}", name_, found_inf.meta_str());
  NoGradGuard no_grad;
  for (auto& group : groups_) {
    {
      UnguardedHostReads validation;  // a traced step need not guard what only validates
      check_group(group);
    }
    std::vector<Tensor> params, grads, originals;
    std::vector<ParamState*> states;
    for (const auto& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;  // untouched by backward: skipped, as PyTorch
      KILN_CHECK(g.shape() == p.shape(), "{}.step: gradient {} does not match parameter {}",
                 name_, g.meta_str(), p.meta_str());
      // The update ops write flat, in place: both must be contiguous, of one dtype.
      grads.push_back(g.to(p.dtype()).contiguous().detach());
      params.push_back(p.is_contiguous() ? p.detach() : p.contiguous().detach());
      originals.push_back(p);
      states.push_back(&state_[p.impl()]);
    }
    if (params.empty()) continue;
    // The update ops bump the versions of what they write; a parameter updated through a
    // contiguous copy gets the result by copy_ (which bumps its version too).
    step_group(group, params, grads, states, found_inf);
    for (size_t i = 0; i < params.size(); ++i)
      if (!originals[i].is_contiguous()) originals[i].detach().copy_(params[i]);
  }
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> dict;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    for (const auto& [key, value] : groups_[g].hyper) dict[prefix + key] = value.clone();
    std::vector<int64_t> indices;
    for (const auto& p : groups_[g].params) {
      auto it = state_.find(p.impl());
      if (it != state_.end())
        for (const auto& [key, value] : it->second)
          dict["state." + std::to_string(index) + "." + key] = value.clone();
      indices.push_back(index++);
    }
    dict[prefix + "params"] = from_vector<int64_t>(indices, {static_cast<int64_t>(indices.size())});
  }
  return dict;
}

namespace {
// "a.12.rest" -> (12, "rest"); false when the key does not have that form.
bool split_indexed_key(const std::string& key, const std::string& prefix, size_t& index,
                       std::string& rest) {
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  const std::string number = key.substr(prefix.size(), dot - prefix.size());
  if (number.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoul(number);
  rest = key.substr(dot + 1);
  return !rest.empty();
}
}  // namespace

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& dict) {
  std::vector<Tensor> all_params;
  for (const auto& group : groups_)
    for (const auto& p : group.params) all_params.push_back(p);
  // Check everything first, so that a bad dict changes nothing.
  size_t group_count = 0;
  for (const auto& [key, value] : dict) {
    size_t index = 0;
    std::string rest;
    if (split_indexed_key(key, "param_groups.", index, rest)) {
      group_count = std::max(group_count, index + 1);
      KILN_CHECK(index < groups_.size(),
                 "{}.load_state_dict: '{}' names group {}, but this optimizer has {} groups",
                 name_, key, index, groups_.size());
      if (rest == "params") {
        KILN_CHECK(value.dim() == 1 && value.numel() == static_cast<int64_t>(groups_[index].params.size()),
                   "{}.load_state_dict: '{}' is {}, but group {} has {} parameters", name_, key,
                   value.meta_str(), index, groups_[index].params.size());
      } else {
        KILN_CHECK(groups_[index].hyper.count(rest) && value.numel() == 1,
                   "{}.load_state_dict: unexpected key '{}' ({})", name_, key, value.meta_str());
      }
    } else if (split_indexed_key(key, "state.", index, rest)) {
      KILN_CHECK(index < all_params.size(),
                 "{}.load_state_dict: '{}' names parameter {}, but this optimizer has {}", name_,
                 key, index, all_params.size());
      if (rest != "step")
        KILN_CHECK(value.shape() == all_params[index].shape(),
                   "{}.load_state_dict: '{}' is {}, but parameter {} is {}", name_, key,
                   value.meta_str(), index, all_params[index].meta_str());
    } else {
      fail("{}.load_state_dict: unexpected key '{}'", name_, key);
    }
  }
  KILN_CHECK(group_count == groups_.size(),
             "{}.load_state_dict: the dict has {} parameter groups, this optimizer has {}", name_,
             group_count, groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g)
    KILN_CHECK(dict.count("param_groups." + std::to_string(g) + ".params"),
               "{}.load_state_dict: missing key 'param_groups.{}.params'", name_, g);

  NoGradGuard no_grad;
  for (const auto& p : all_params) state_.erase(p.impl());
  for (const auto& [key, value] : dict) {
    size_t index = 0;
    std::string rest;
    if (split_indexed_key(key, "param_groups.", index, rest)) {
      if (rest != "params") groups_[index].set(rest, value.to(DType::f64).item<double>());
    } else if (split_indexed_key(key, "state.", index, rest)) {
      const Tensor& p = all_params[index];
      const DType dtype = rest == "step" ? DType::f64 : p.dtype();
      state_[p.impl()][rest] = value.to(dtype).to(state_device(p, rest, value.device())).clone();
    }
  }
}

std::vector<ParamGroupSpec> param_groups_no_decay(const std::vector<Tensor>& params, double weight_decay) {
  ParamGroupSpec decay{{}, {{"weight_decay", weight_decay}}};
  ParamGroupSpec no_decay{{}, {{"weight_decay", 0.0}}};
  for (const Tensor& p : params) (p.dim() <= 1 ? no_decay : decay).params.push_back(p);
  std::vector<ParamGroupSpec> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

}  // namespace kiln::optim
