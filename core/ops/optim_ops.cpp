// The optimizer update ops (core/ops/optim_ops.h): shape and dtype rules and public
// functions. The in-place forms have no outputs (the kernel writes the mutated inputs); the
// pure forms return the new values of the mutated inputs that were given, in input order,
// which is what the tracer writes back into them.
#include "core/ops/optim_ops.h"

#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln {
namespace {

bool flag(const Attrs& a, const char* attr, const char* op) {
  KILN_CHECK(a.has(attr), "{}: attribute '{}' is required ({})", op, attr, a.to_string());
  return a.b(attr);
}

// Param and grad: f32 or f64, one dtype, shape and device.
void check_param_and_grad(std::span<const TensorMeta> in, const char* op) {
  const TensorMeta &p = in[0], &g = in[1];
  KILN_CHECK(p.defined && g.defined, "{}: param and grad are required ({})", op, metas_str(in));
  KILN_CHECK(p.dtype == DType::f32 || p.dtype == DType::f64,
             "{}: parameters must be f32 or f64, got {}", op, metas_str(in));
  KILN_CHECK(g.dtype == p.dtype && g.shape == p.shape,
             "{}: grad must have the parameter's dtype and shape ({})", op, metas_str(in));
  KILN_CHECK(g.device == p.device, "{}: param and grad must be on one device, got {}", op,
             metas_str(in));
}

// A state tensor (momentum buffer, moments) shaped and typed as the parameter.
void check_state(const TensorMeta& m, const char* what, std::span<const TensorMeta> in,
                 const char* op) {
  if (!m.defined) return;
  KILN_CHECK(m.dtype == in[0].dtype && m.shape == in[0].shape && m.device == in[0].device,
             "{}: {} must have the parameter's dtype, shape and device ({})", op, what,
             metas_str(in));
}

// The optional found_inf after the hyperparameters, at in[at] when the call has it: a 0-d
// f32 tensor on the CPU or on the parameter's device.
void check_found_inf(std::span<const TensorMeta> in, size_t at, const char* op) {
  if (in.size() <= at || !in[at].defined) return;
  const TensorMeta& f = in[at];
  KILN_CHECK(f.shape.empty() && f.dtype == DType::f32 && (f.device.is_cpu() || f.device == in[0].device),
             "{}: found_inf must be a 0-d f32 tensor on the CPU or on the parameter's device ({}), got {}", op,
             in[0].device.str(), f.str());
}

// 0-d hyperparameters from `first` up to `end`: required, one element, floating or integer.
void check_scalars(std::span<const TensorMeta> in, size_t first, size_t end, const char* const* names,
                   const char* op) {
  for (size_t i = first; i < end; ++i) {
    const TensorMeta& m = in[i];
    const char* what = names[i - first];
    KILN_CHECK(m.defined, "{}: {} is required ({})", op, what, metas_str(in));
    // On the parameter's device: a whole step compiled for CUDA graphs reads them there.
    KILN_CHECK(m.shape.empty() && m.dtype != DType::boolean && (m.device.is_cpu() || m.device == in[0].device),
               "{}: {} must be a 0-d numeric tensor on the CPU or on the parameter's device ({}), got {}", op, what,
               in[0].device.str(), m.str());
  }
}

// The outputs of a pure form: a parameter-like tensor per given mutated input.
std::vector<TensorMeta> like_param(std::span<const TensorMeta> in, std::initializer_list<int> mutated) {
  std::vector<TensorMeta> out;
  for (int i : mutated)
    if (in[static_cast<size_t>(i)].defined) out.push_back(TensorMeta{in[0].shape, in[0].dtype, in[0].device});
  return out;
}

constexpr const char* kSGDScalars[] = {"lr", "momentum", "dampening", "weight_decay"};

// (param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay)
void check_sgd(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 7 || in.size() == 8,
             "{}: expects 7 tensors, or 8 with found_inf (absent optional ones undefined), got {}", op, in.size());
  check_param_and_grad(in, op);
  check_state(in[2], "momentum_buffer", in, op);
  check_scalars(in, 3, 7, kSGDScalars, op);
  check_found_inf(in, 7, op);
  flag(a, "nesterov", op);
  flag(a, "maximize", op);
  flag(a, "first", op);
}

std::vector<TensorMeta> infer_sgd_update_(std::span<const TensorMeta> in, const Attrs& a) {
  check_sgd(in, a, "sgd_update_");
  return {};
}

std::vector<TensorMeta> infer_sgd_update(std::span<const TensorMeta> in, const Attrs& a) {
  check_sgd(in, a, "sgd_update");
  return like_param(in, {0, 2});
}

constexpr const char* kAdamWScalars[] = {"step", "lr", "beta1", "beta2", "eps", "weight_decay"};

// (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step, lr, beta1, beta2, eps,
// weight_decay)
void check_adamw(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 11 || in.size() == 12,
             "{}: expects 11 tensors, or 12 with found_inf (absent optional ones undefined), got {}", op, in.size());
  check_param_and_grad(in, op);
  KILN_CHECK(in[2].defined && in[3].defined, "{}: exp_avg and exp_avg_sq are required ({})", op,
             metas_str(in));
  check_state(in[2], "exp_avg", in, op);
  check_state(in[3], "exp_avg_sq", in, op);
  check_state(in[4], "max_exp_avg_sq", in, op);
  check_scalars(in, 5, 11, kAdamWScalars, op);
  check_found_inf(in, 11, op);
  KILN_CHECK(flag(a, "amsgrad", op) == in[4].defined,
             "{}: max_exp_avg_sq must be given exactly when amsgrad is set ({}; {})", op,
             a.to_string(), metas_str(in));
  flag(a, "maximize", op);
}

std::vector<TensorMeta> infer_adamw_update_(std::span<const TensorMeta> in, const Attrs& a) {
  check_adamw(in, a, "adamw_update_");
  return {};
}

std::vector<TensorMeta> infer_adamw_update(std::span<const TensorMeta> in, const Attrs& a) {
  check_adamw(in, a, "adamw_update");
  return like_param(in, {0, 2, 3, 4});
}

const OpDef& kSGDUpdateInPlace =
    define_op({.name = "sgd_update_", .infer = infer_sgd_update_, .mutated_inputs = {0, 2}, .pure_twin = "sgd_update"});
const OpDef& kSGDUpdate = define_op({.name = "sgd_update", .infer = infer_sgd_update});
const OpDef& kAdamWUpdateInPlace = define_op(
    {.name = "adamw_update_", .infer = infer_adamw_update_, .mutated_inputs = {0, 2, 3, 4}, .pure_twin = "adamw_update"});
const OpDef& kAdamWUpdate = define_op({.name = "adamw_update", .infer = infer_adamw_update});

// found_inf goes last, and only when given: a call without it keeps the short input list.
void push_found_inf(std::vector<Tensor>& in, const Tensor& found_inf) {
  if (found_inf.defined()) in.push_back(found_inf);
}

std::vector<Tensor> sgd_inputs(const Tensor& param, const Tensor& grad, const Tensor& buffer,
                               const SGDHyper& h) {
  std::vector<Tensor> in{param, grad, buffer, h.lr, h.momentum, h.dampening, h.weight_decay};
  push_found_inf(in, h.found_inf);
  return in;
}
Attrs sgd_attrs(SGDFlags f) {
  return {{"nesterov", f.nesterov}, {"maximize", f.maximize}, {"first", f.first}};
}

std::vector<Tensor> adamw_inputs(const Tensor& param, const Tensor& grad, const AdamWState& s,
                                 const AdamWHyper& h) {
  std::vector<Tensor> in{param, grad, s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq, s.step,
                         h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  push_found_inf(in, h.found_inf);
  return in;
}
Attrs adamw_attrs(AdamWFlags f) { return {{"amsgrad", f.amsgrad}, {"maximize", f.maximize}}; }

// ---- multi-tensor forms ----
//
// Inputs: `roles` groups of `count` tensors (role r of parameter k at r * count + k), then
// the hyperparameters. The single op's inputs are the same roles, one tensor each.
constexpr int64_t kSGDRoles = 3;    // param, grad, momentum_buffer
constexpr int64_t kAdamWRoles = 6;  // param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step

int64_t count_of(const Attrs& a, const char* op) {
  KILN_CHECK(a.has("count"), "{}: attribute 'count' is required ({})", op, a.to_string());
  const int64_t count = a.i("count");
  KILN_CHECK(count >= 1, "{}: count must be at least 1, got {}", op, count);
  return count;
}

// Parameter k's share of a multi-tensor input list.
template <class T>
std::vector<T> single_slice(std::span<const T> in, int64_t count, int64_t roles, int64_t k) {
  std::vector<T> out;
  for (int64_t r = 0; r < roles; ++r) out.push_back(in[static_cast<size_t>(r * count + k)]);
  out.insert(out.end(), in.begin() + roles * count, in.end());
  return out;
}

// The inputs of `roles` for every parameter, role by role: what the in-place form writes
// (all but the grads and step counts), and so the order of the pure form's outputs.
std::vector<int> role_inputs(int64_t count, std::initializer_list<int64_t> roles) {
  std::vector<int> out;
  for (int64_t r : roles)
    for (int64_t k = 0; k < count; ++k) out.push_back(static_cast<int>(r * count + k));
  return out;
}
std::vector<int> sgd_multi_mutated(const Attrs& a) { return role_inputs(count_of(a, "sgd_update_multi_"), {0, 2}); }
std::vector<int> adamw_multi_mutated(const Attrs& a) {
  return role_inputs(count_of(a, "adamw_update_multi_"), {0, 2, 3, 4});
}

// Checks every parameter's slice with the single op's rule (errors name the op and the
// parameter's index), that an optional role is given for all parameters or none, and that
// all parameters share the first one's dtype and device. Returns the count.
using SingleCheck = void (*)(std::span<const TensorMeta>, const Attrs&, const char*);
int64_t check_multi(std::span<const TensorMeta> in, const Attrs& a, const char* op, int64_t roles,
                    int64_t hypers, int64_t optional_role, SingleCheck check) {
  const int64_t count = count_of(a, op);
  const auto size = static_cast<int64_t>(in.size());
  KILN_CHECK(size == roles * count + hypers || size == roles * count + hypers + 1,
             "{}: expects {} tensors for count {} ({} per parameter, then {} hyperparameters, then an optional "
             "found_inf), got {}",
             op, roles * count + hypers, count, roles, hypers, in.size());
  const bool optional_given = in[static_cast<size_t>(optional_role * count)].defined;
  for (int64_t k = 0; k < count; ++k) {
    const std::string label = fmt::format("{} (parameter {})", op, k);
    const std::vector<TensorMeta> slice = single_slice(in, count, roles, k);
    check(slice, a, label.c_str());
    KILN_CHECK(slice[static_cast<size_t>(optional_role)].defined == optional_given,
               "{}: an optional state tensor must be given for every parameter or none ({})", label,
               metas_str(slice));
    KILN_CHECK(slice[0].dtype == in[0].dtype && slice[0].device == in[0].device,
               "{}: every parameter must have parameter 0's dtype and device ({}), got {}", label,
               in[0].str(), slice[0].str());
  }
  return count;
}

// The pure forms' outputs: one parameter-like tensor per given mutated input.
std::vector<TensorMeta> multi_outputs(std::span<const TensorMeta> in, const std::vector<int>& mutated,
                                      int64_t count) {
  std::vector<TensorMeta> out;
  for (int i : mutated) {
    const TensorMeta& m = in[static_cast<size_t>(i)];
    const TensorMeta& param = in[static_cast<size_t>(i % count)];
    if (m.defined) out.push_back(TensorMeta{param.shape, param.dtype, param.device});
  }
  return out;
}

std::vector<TensorMeta> infer_sgd_update_multi_(std::span<const TensorMeta> in, const Attrs& a) {
  check_multi(in, a, "sgd_update_multi_", kSGDRoles, 4, 2, check_sgd);
  return {};
}
std::vector<TensorMeta> infer_sgd_update_multi(std::span<const TensorMeta> in, const Attrs& a) {
  const int64_t count = check_multi(in, a, "sgd_update_multi", kSGDRoles, 4, 2, check_sgd);
  return multi_outputs(in, role_inputs(count, {0, 2}), count);
}
std::vector<TensorMeta> infer_adamw_update_multi_(std::span<const TensorMeta> in, const Attrs& a) {
  check_multi(in, a, "adamw_update_multi_", kAdamWRoles, 5, 4, check_adamw);
  return {};
}
std::vector<TensorMeta> infer_adamw_update_multi(std::span<const TensorMeta> in, const Attrs& a) {
  const int64_t count = check_multi(in, a, "adamw_update_multi", kAdamWRoles, 5, 4, check_adamw);
  return multi_outputs(in, role_inputs(count, {0, 2, 3, 4}), count);
}

const OpDef& kSGDUpdateMultiInPlace = define_op(
    {.name = "sgd_update_multi_", .infer = infer_sgd_update_multi_, .mutated_inputs_of = sgd_multi_mutated,
     .pure_twin = "sgd_update_multi"});
const OpDef& kSGDUpdateMulti = define_op({.name = "sgd_update_multi", .infer = infer_sgd_update_multi});
const OpDef& kAdamWUpdateMultiInPlace = define_op({.name = "adamw_update_multi_",
                                                   .infer = infer_adamw_update_multi_,
                                                   .mutated_inputs_of = adamw_multi_mutated,
                                                   .pure_twin = "adamw_update_multi"});
const OpDef& kAdamWUpdateMulti = define_op({.name = "adamw_update_multi", .infer = infer_adamw_update_multi});

// The flat input list of a multi call; a length mismatch between the spans is the caller's.
std::vector<Tensor> sgd_multi_inputs(std::span<const Tensor> params, std::span<const Tensor> grads,
                                     std::span<const Tensor> buffers, const SGDHyper& h, const char* op) {
  KILN_CHECK(grads.size() == params.size() && (buffers.empty() || buffers.size() == params.size()),
             "{}: {} params need as many grads (got {}) and momentum buffers (got {}; none without momentum)",
             op, params.size(), grads.size(), buffers.size());
  std::vector<Tensor> in(params.begin(), params.end());
  in.insert(in.end(), grads.begin(), grads.end());
  if (buffers.empty()) in.resize(in.size() + params.size());
  else in.insert(in.end(), buffers.begin(), buffers.end());
  for (const Tensor& t : {h.lr, h.momentum, h.dampening, h.weight_decay}) in.push_back(t);
  push_found_inf(in, h.found_inf);
  return in;
}
Attrs sgd_multi_attrs(size_t count, SGDFlags f) {
  Attrs a = sgd_attrs(f);
  a.set("count", static_cast<int64_t>(count));
  return a;
}

std::vector<Tensor> adamw_multi_inputs(std::span<const Tensor> params, std::span<const Tensor> grads,
                                       std::span<const AdamWState> states, const AdamWHyper& h,
                                       const char* op) {
  KILN_CHECK(grads.size() == params.size() && states.size() == params.size(),
             "{}: {} params need as many grads (got {}) and states (got {})", op, params.size(),
             grads.size(), states.size());
  std::vector<Tensor> in(params.begin(), params.end());
  in.insert(in.end(), grads.begin(), grads.end());
  for (Tensor AdamWState::*role : {&AdamWState::exp_avg, &AdamWState::exp_avg_sq,
                                   &AdamWState::max_exp_avg_sq, &AdamWState::step})
    for (const AdamWState& s : states) in.push_back(s.*role);
  for (const Tensor& t : {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay}) in.push_back(t);
  push_found_inf(in, h.found_inf);
  return in;
}
Attrs adamw_multi_attrs(size_t count, AdamWFlags f) {
  Attrs a = adamw_attrs(f);
  a.set("count", static_cast<int64_t>(count));
  return a;
}

}  // namespace

std::vector<Tensor> sgd_single_inputs(std::span<const Tensor> in, int64_t count, int64_t k) {
  return single_slice(in, count, kSGDRoles, k);
}
std::vector<Tensor> adamw_single_inputs(std::span<const Tensor> in, int64_t count, int64_t k) {
  return single_slice(in, count, kAdamWRoles, k);
}

// Optimizer updates are not differentiated (PyTorch runs them under no_grad): no graph.
void sgd_update_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                 const SGDHyper& hyper, SGDFlags flags) {
  NoGradGuard no_grad;
  call_op(kSGDUpdateInPlace, sgd_inputs(param, grad, momentum_buffer, hyper), sgd_attrs(flags));
}

SGDUpdate sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                     const SGDHyper& hyper, SGDFlags flags) {
  NoGradGuard no_grad;
  std::vector<Tensor> out =
      call_op(kSGDUpdate, sgd_inputs(param, grad, momentum_buffer, hyper), sgd_attrs(flags));
  return {out[0], out.size() > 1 ? out[1] : Tensor()};
}

void adamw_update_(const Tensor& param, const Tensor& grad, const AdamWState& state,
                   const AdamWHyper& hyper, AdamWFlags flags) {
  NoGradGuard no_grad;
  call_op(kAdamWUpdateInPlace, adamw_inputs(param, grad, state, hyper), adamw_attrs(flags));
}

AdamWUpdate adamw_update(const Tensor& param, const Tensor& grad, const AdamWState& state,
                         const AdamWHyper& hyper, AdamWFlags flags) {
  NoGradGuard no_grad;
  std::vector<Tensor> out =
      call_op(kAdamWUpdate, adamw_inputs(param, grad, state, hyper), adamw_attrs(flags));
  return {out[0], out[1], out[2], out.size() > 3 ? out[3] : Tensor()};
}

void sgd_update_multi_(std::span<const Tensor> params, std::span<const Tensor> grads,
                       std::span<const Tensor> momentum_buffers, const SGDHyper& hyper,
                       SGDFlags flags) {
  NoGradGuard no_grad;
  call_op(kSGDUpdateMultiInPlace, sgd_multi_inputs(params, grads, momentum_buffers, hyper, "sgd_update_multi_"),
          sgd_multi_attrs(params.size(), flags));
}

std::vector<SGDUpdate> sgd_update_multi(std::span<const Tensor> params, std::span<const Tensor> grads,
                                        std::span<const Tensor> momentum_buffers,
                                        const SGDHyper& hyper, SGDFlags flags) {
  NoGradGuard no_grad;
  const std::vector<Tensor> out =
      call_op(kSGDUpdateMulti, sgd_multi_inputs(params, grads, momentum_buffers, hyper, "sgd_update_multi"),
              sgd_multi_attrs(params.size(), flags));
  const size_t n = params.size();
  std::vector<SGDUpdate> updates(n);
  for (size_t k = 0; k < n; ++k)
    updates[k] = {out[k], out.size() > n ? out[n + k] : Tensor()};
  return updates;
}

void adamw_update_multi_(std::span<const Tensor> params, std::span<const Tensor> grads,
                         std::span<const AdamWState> states, const AdamWHyper& hyper,
                         AdamWFlags flags) {
  NoGradGuard no_grad;
  call_op(kAdamWUpdateMultiInPlace, adamw_multi_inputs(params, grads, states, hyper, "adamw_update_multi_"),
          adamw_multi_attrs(params.size(), flags));
}

std::vector<AdamWUpdate> adamw_update_multi(std::span<const Tensor> params,
                                            std::span<const Tensor> grads,
                                            std::span<const AdamWState> states,
                                            const AdamWHyper& hyper, AdamWFlags flags) {
  NoGradGuard no_grad;
  const std::vector<Tensor> out =
      call_op(kAdamWUpdateMulti, adamw_multi_inputs(params, grads, states, hyper, "adamw_update_multi"),
              adamw_multi_attrs(params.size(), flags));
  const size_t n = params.size();
  std::vector<AdamWUpdate> updates(n);
  for (size_t k = 0; k < n; ++k)
    updates[k] = {out[k], out[n + k], out[2 * n + k], out.size() > 3 * n ? out[3 * n + k] : Tensor()};
  return updates;
}

}  // namespace kiln
