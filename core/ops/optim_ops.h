#pragma once
// The optimizers' per-parameter updates as registry ops, so that a traced training step
// sees them (compiler/trace.h records an in-place update as its pure twin plus
// write-backs). Hyperparameters are 0-d tensors (any floating dtype, read as f64 when the
// kernel runs): a schedule that writes a new value into the same tensor is seen by a
// compiled step without recompiling. Flags that never change (nesterov, maximize, amsgrad)
// are attributes.
//
// Ops (inputs in order; "?" marks an optional input, undefined when absent):
//   sgd_update_(param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay)
//       {nesterov, maximize, first}: writes param and momentum_buffer in place; no outputs.
//   sgd_update(same inputs) -> (new_param, new_momentum_buffer if one was given)
//   adamw_update_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step, lr, beta1,
//       beta2, eps, weight_decay) {amsgrad, maximize}: writes param, exp_avg, exp_avg_sq
//       and max_exp_avg_sq in place; no outputs.
//   adamw_update(same inputs) -> (new_param, new_exp_avg, new_exp_avg_sq,
//       new_max_exp_avg_sq if one was given)
//
// Multi-tensor forms (PyTorch's foreach optimizers): one call updates the N parameters of a
// group, so that an optimizer step is one op per group, eagerly (one parallel region on the
// CPU) and in a traced step (one node). Attribute count = N; tensors grouped by role, each
// group in parameter order, then the single op's hyperparameters:
//   sgd_update_multi_(param x N, grad x N, momentum_buffer x N?, lr, momentum, dampening,
//       weight_decay) {count, nesterov, maximize, first}: the buffers all given or all absent.
//   sgd_update_multi(same inputs) -> (new_param x N, new_momentum_buffer x N if given)
//   adamw_update_multi_(param x N, grad x N, exp_avg x N, exp_avg_sq x N,
//       max_exp_avg_sq x N?, step x N, lr, beta1, beta2, eps, weight_decay)
//       {count, amsgrad, maximize}: each parameter keeps its own step count.
//   adamw_update_multi(same inputs) -> (new_param x N, new_exp_avg x N, new_exp_avg_sq x N,
//       new_max_exp_avg_sq x N if given)
// Parameter k's result is bit for bit what the single op gives for its tensors. Every
// parameter of one call has one dtype and one device (the optimizers split a group that
// mixes them into one call per kind).
// Param, grad and state tensors are f32 or f64 CPU tensors of one dtype and shape; the
// in-place forms need param and state contiguous. Each pure op computes, element for
// element, exactly what its in-place form writes (one shared loop).
//
// Skipped steps (mixed precision, optim/grad_scaler.h): every form takes one more, optional,
// input after the hyperparameters: found_inf, a 0-d f32 tensor on the CPU or on the
// parameters' device. When it is nonzero the update is skipped: the in-place forms write
// nothing, the pure forms return the inputs' values. The kernels read it when they run (on
// the device, inside the CUDA kernels), so a traced step neither reads nor guards it and a
// CUDA step does not wait for it on the host.
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct SGDHyper {
  Tensor lr, momentum, dampening, weight_decay;  // 0-d
  Tensor found_inf;  // optional: the step is skipped when nonzero (see the top of the file)
};
struct SGDFlags {
  bool nesterov = false;
  bool maximize = false;
  // The momentum buffer is new: it takes the (decayed) gradient as it is, whatever it held.
  bool first = false;
};

// Per element: d = grad (negated when maximize) + weight_decay * param; with a momentum
// buffer, buf = d (first) or momentum * buf + (1 - dampening) * d, then d = d + momentum *
// buf (nesterov) or buf; param -= lr * d. Records no autograd graph.
void sgd_update_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                 const SGDHyper& hyper, SGDFlags flags);

struct SGDUpdate {
  Tensor param;
  Tensor momentum_buffer;  // undefined when none was given
};
// sgd_update_'s new values as new tensors; the arguments are left unchanged.
SGDUpdate sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                     const SGDHyper& hyper, SGDFlags flags);

struct AdamWHyper {
  Tensor lr, beta1, beta2, eps, weight_decay;  // 0-d
  Tensor found_inf;  // optional: the step is skipped when nonzero (see the top of the file)
};
struct AdamWFlags {
  bool amsgrad = false;  // max_exp_avg_sq must be given exactly when amsgrad
  bool maximize = false;
};
struct AdamWState {
  Tensor exp_avg, exp_avg_sq;
  Tensor max_exp_avg_sq;  // amsgrad only
  Tensor step;            // 0-d: the step count t of this update (already incremented)
};

// Per element, with bias corrections from t = step: param *= 1 - lr * weight_decay;
// m += (1 - beta1) (grad - m); v = beta2 v + (1 - beta2) grad^2; (amsgrad: vmax = max(vmax,
// v), used for v); param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
// The scalar factors are computed in f64, the elementwise work in the parameter's dtype.
// Records no autograd graph.
void adamw_update_(const Tensor& param, const Tensor& grad, const AdamWState& state,
                   const AdamWHyper& hyper, AdamWFlags flags);

struct AdamWUpdate {
  Tensor param, exp_avg, exp_avg_sq;
  Tensor max_exp_avg_sq;  // undefined when none was given
};
// adamw_update_'s new values as new tensors; the arguments are left unchanged.
AdamWUpdate adamw_update(const Tensor& param, const Tensor& grad, const AdamWState& state,
                         const AdamWHyper& hyper, AdamWFlags flags);

// The multi-tensor forms: one op call for all of `params` (the spans have one entry per
// parameter; momentum_buffers is empty without momentum). Records no autograd graph.
void sgd_update_multi_(std::span<const Tensor> params, std::span<const Tensor> grads,
                       std::span<const Tensor> momentum_buffers, const SGDHyper& hyper,
                       SGDFlags flags);
std::vector<SGDUpdate> sgd_update_multi(std::span<const Tensor> params, std::span<const Tensor> grads,
                                        std::span<const Tensor> momentum_buffers,
                                        const SGDHyper& hyper, SGDFlags flags);
void adamw_update_multi_(std::span<const Tensor> params, std::span<const Tensor> grads,
                         std::span<const AdamWState> states, const AdamWHyper& hyper,
                         AdamWFlags flags);
std::vector<AdamWUpdate> adamw_update_multi(std::span<const Tensor> params,
                                            std::span<const Tensor> grads,
                                            std::span<const AdamWState> states,
                                            const AdamWHyper& hyper, AdamWFlags flags);

// Parameter k's inputs of a multi-tensor call (its flat input list `in`, count = N), in the
// single op's order: how a kernel runs the multi op as N single updates.
std::vector<Tensor> sgd_single_inputs(std::span<const Tensor> in, int64_t count, int64_t k);
std::vector<Tensor> adamw_single_inputs(std::span<const Tensor> in, int64_t count, int64_t k);

// The found_inf input of a single update's inputs (`hypers_end` = 7 for sgd, 11 for adamw):
// undefined when the call has none.
inline Tensor found_inf_input(std::span<const Tensor> in, size_t hypers_end) {
  return in.size() > hypers_end ? in[hypers_end] : Tensor();
}

}  // namespace kiln
