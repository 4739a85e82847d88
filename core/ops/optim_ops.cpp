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

// 0-d hyperparameters from `first` on: required, one element, floating or integer.
void check_scalars(std::span<const TensorMeta> in, size_t first, const char* const* names,
                   const char* op) {
  for (size_t i = first; i < in.size(); ++i) {
    const TensorMeta& m = in[i];
    const char* what = names[i - first];
    KILN_CHECK(m.defined, "{}: {} is required ({})", op, what, metas_str(in));
    KILN_CHECK(m.shape.empty() && m.dtype != DType::boolean && m.device.is_cpu(),
               "{}: {} must be a 0-d numeric CPU tensor, got {}", op, what, m.str());
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
  KILN_CHECK(in.size() == 7, "{}: expects 7 tensors (absent optional ones undefined), got {}", op,
             in.size());
  check_param_and_grad(in, op);
  check_state(in[2], "momentum_buffer", in, op);
  check_scalars(in, 3, kSGDScalars, op);
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
  KILN_CHECK(in.size() == 11, "{}: expects 11 tensors (absent optional ones undefined), got {}",
             op, in.size());
  check_param_and_grad(in, op);
  KILN_CHECK(in[2].defined && in[3].defined, "{}: exp_avg and exp_avg_sq are required ({})", op,
             metas_str(in));
  check_state(in[2], "exp_avg", in, op);
  check_state(in[3], "exp_avg_sq", in, op);
  check_state(in[4], "max_exp_avg_sq", in, op);
  check_scalars(in, 5, kAdamWScalars, op);
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
    define_op({.name = "sgd_update_", .infer = infer_sgd_update_, .mutated_inputs = {0, 2}});
const OpDef& kSGDUpdate = define_op({.name = "sgd_update", .infer = infer_sgd_update});
const OpDef& kAdamWUpdateInPlace = define_op(
    {.name = "adamw_update_", .infer = infer_adamw_update_, .mutated_inputs = {0, 2, 3, 4}});
const OpDef& kAdamWUpdate = define_op({.name = "adamw_update", .infer = infer_adamw_update});

std::vector<Tensor> sgd_inputs(const Tensor& param, const Tensor& grad, const Tensor& buffer,
                               const SGDHyper& h) {
  return {param, grad, buffer, h.lr, h.momentum, h.dampening, h.weight_decay};
}
Attrs sgd_attrs(SGDFlags f) {
  return {{"nesterov", f.nesterov}, {"maximize", f.maximize}, {"first", f.first}};
}

std::vector<Tensor> adamw_inputs(const Tensor& param, const Tensor& grad, const AdamWState& s,
                                 const AdamWHyper& h) {
  return {param, grad, s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq, s.step,
          h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
}
Attrs adamw_attrs(AdamWFlags f) { return {{"amsgrad", f.amsgrad}, {"maximize", f.maximize}}; }

}  // namespace

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

}  // namespace kiln
