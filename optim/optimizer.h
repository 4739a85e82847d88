#pragma once
// Optimizer: the base of kiln's optimizers, with torch.optim's semantics (parameter groups,
// per-parameter state, zero_grad, step, state_dict).
//
// Hyperparameters live in each group as 0-d f64 CPU tensors, and a step reads their values
// from those tensors each time it runs. A schedule changes a value by writing into the same
// tensor (set_lr), never by replacing it, so a compiled step can take these tensors as
// graph inputs and see every change without recompiling.
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace kiln::optim {

// The tensors of one parameter's state ("momentum_buffer", "exp_avg", "step", ...).
using ParamState = std::map<std::string, Tensor>;

// What a caller gives to make a group: its parameters and the hyperparameters that differ
// from the optimizer's defaults (by name: "lr", "weight_decay", "momentum", ...).
struct ParamGroupSpec {
  std::vector<Tensor> params;
  std::map<std::string, double> options;
};

// One parameter group: its parameters and its hyperparameters as 0-d f64 tensors.
class ParamGroup {
 public:
  std::vector<Tensor> params;
  // Every hyperparameter of the optimizer, by name; booleans are 0 or 1.
  std::map<std::string, Tensor> hyper;

  // The value of hyperparameter `name`; an error names the known ones when absent.
  double get(const std::string& name) const;
  // Writes `value` into the existing tensor of `name` (the tensor itself stays the same).
  void set(const std::string& name, double value);
  double lr() const { return get("lr"); }
  void set_lr(double value) { set("lr", value); }
  double weight_decay() const { return get("weight_decay"); }
  void set_weight_decay(double value) { set("weight_decay", value); }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Adds a group; hyperparameters not in spec.options come from the defaults. Unknown
  // names, parameters already in a group and non-floating parameters are errors.
  void add_param_group(const ParamGroupSpec& spec);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // Moves hyperparameters `names` of every group to `device`, once (set() writes into the
  // moved tensors from then on), so that the update kernels read them where they run: a CUDA
  // graph of a whole training step holds no host tensor and replays each step's lr. get()
  // then reads the device. Leave the flags a step reads on the host (SGD's nesterov,
  // maximize) where they are: a compiled step checks their value at every call.
  void move_hyperparameters(const std::vector<std::string>& names, Device device);

  // Clears every parameter's gradient: undefined (set_to_none) or filled with zeros.
  void zero_grad(bool set_to_none = true);
  // One update of every parameter that has a gradient, in place, without recording a graph.
  void step();
  // The same, skipped when found_inf (a 0-d f32 tensor, on the CPU or the parameters'
  // device) is nonzero: parameters, state and step counts are left as they were. The update
  // kernels read found_inf when they run, so nothing here waits for it on the host (a
  // traced step holds for either value), except a default AdamW's step counts of CUDA
  // parameters, which live on the host and are bumped by 1 - found_inf read back once per
  // step (a capturable AdamW's live on the device).
  // optim::GradScaler calls this; found_inf undefined is step().
  void step(const Tensor& found_inf);

  // The state of `param` (created empty on first use).
  ParamState& state(const Tensor& param);
  // Whether `param` has any state yet.
  bool has_state(const Tensor& param) const;

  // Hyperparameters as "param_groups.<g>.<name>", each group's parameter indices as
  // "param_groups.<g>.params" (i64), and state as "state.<i>.<name>", where i counts
  // parameters over all groups in order. Values are copies.
  std::map<std::string, Tensor> state_dict() const;
  // Restores what state_dict gave. The group count, each group's parameter count and each
  // state tensor's shape must match this optimizer; errors name the offending key.
  void load_state_dict(const std::map<std::string, Tensor>& dict);

 protected:
  // `name` is the optimizer's name for errors; `defaults` every hyperparameter it has.
  Optimizer(std::string name, std::map<std::string, double> defaults);
  // Updates the parameters of one group that have gradients, in place; `grads[i]` is
  // contiguous with params[i]'s dtype and `states[i]` its state. found_inf: as step's
  // (undefined: never skipped).
  virtual void step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                          const std::vector<Tensor>& grads, const std::vector<ParamState*>& states,
                          const Tensor& found_inf) = 0;
  // Checks the values of a group's hyperparameters (errors name the optimizer).
  virtual void check_group(const ParamGroup&) const {}
  // Where load_state_dict puts `param`'s state tensor `name`, saved on `saved`: there, by
  // default (AdamW moves its step counts to where it keeps them).
  virtual Device state_device(const Tensor& /*param*/, const std::string& /*name*/, Device saved) const { return saved; }

  std::string name_;

 private:
  std::map<std::string, double> defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

// Two groups over `params`: matrices and larger (weight_decay = weight_decay) and 1-d
// parameters such as biases and norm weights (weight_decay = 0). Empty groups are left out.
// models/module_adapters.h adds the form over a module's parameters.
std::vector<ParamGroupSpec> param_groups_no_decay(const std::vector<Tensor>& params, double weight_decay);

}  // namespace kiln::optim
