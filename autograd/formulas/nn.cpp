// Backward formulas of the neural-network ops: convolution, pooling, normalization,
// softmax and the losses. Each defers to the op's backward op (core/ops/*.h), so a traced
// backward is made of ordinary ops.
#include "autograd/formula.h"
#include "core/ops/attention.h"
#include "core/ops/conv.h"
#include "core/ops/elementwise.h"
#include "core/ops/linear_cross_entropy.h"
#include "core/ops/loss.h"
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"

namespace kiln {
namespace {

// The gradient `g` in the dtype of input `i` (the backward ops answer in the promoted type
// of their operands).
Tensor in_dtype_of(const BackwardContext& c, size_t i, const Tensor& g) {
  return g.dtype() == c.input_metas[i].dtype ? g : g.to(c.input_metas[i].dtype);
}

// ---- convolution ----

// conv2d(input, weight, bias?): the two conv gradients, and the bias's is grad_out summed
// over every dim but the channel.
std::vector<Tensor> conv2d_backward(const BackwardContext& c) {
  std::vector<Tensor> out(c.input_metas.size());
  const Tensor& g = c.grad();
  if (!g.defined()) return out;
  const Conv2dGeometry geo =
      conv2d_geometry(c.input_metas[0].shape, c.input_metas[1].shape, c.attrs, "conv2d");
  const Conv2dOptions options{.stride = {geo.stride_h, geo.stride_w},
                              .padding = {geo.pad_h, geo.pad_w},
                              .dilation = {geo.dilation_h, geo.dilation_w},
                              .groups = geo.groups};
  if (c.needs(0)) out[0] = conv2d_backward_input(g, c.input(1), geo.input_shape(), options);
  if (c.needs(1)) out[1] = conv2d_backward_weight(g, c.input(0), geo.weight_shape(), options);
  if (c.needs(2)) out[2] = sum(g, {0, 2, 3});
  return out;
}

// ---- pooling ----

std::vector<int64_t> pair(const int64_t (&v)[2]) { return {v[0], v[1]}; }

// max_pool2d -> (values, indices): grad_out of the values goes back to where each maximum
// came from; the i64 indices carry no gradient.
std::vector<Tensor> max_pool2d_backward_formula(const BackwardContext& c) {
  const Tensor& g = c.grad(0);
  if (!g.defined() || !c.needs(0)) return {Tensor()};
  // The pooling gradients take the forward input's layout (core/ops/pool.h).
  return {max_pool2d_backward(g, c.output(1), c.input_metas[0].shape, c.input_metas[0].memory_format)};
}

std::vector<Tensor> avg_pool2d_backward_formula(const BackwardContext& c) {
  const Tensor& g = c.grad();
  if (!g.defined() || !c.needs(0)) return {Tensor()};
  const Pool2dParams p = pool2d_params(c.attrs, "avg_pool2d");
  const std::optional<int64_t> divisor =
      p.divisor != 0 ? std::optional<int64_t>(p.divisor) : std::nullopt;
  return {avg_pool2d_backward(g, c.input_metas[0].shape, pair(p.kernel), pair(p.stride),
                              pair(p.padding), p.ceil_mode, p.count_include_pad, divisor,
                              c.input_metas[0].memory_format)};
}

std::vector<Tensor> adaptive_avg_pool2d_backward_formula(const BackwardContext& c) {
  const Tensor& g = c.grad();
  if (!g.defined() || !c.needs(0)) return {Tensor()};
  return {adaptive_avg_pool2d_backward(g, c.input_metas[0].shape, c.input_metas[0].memory_format)};
}

// ---- normalization ----

// batch_norm(input, weight?, bias?, running_mean?, running_var?) -> (out, save_mean,
// save_invstd). Only `out` carries a gradient (the saved statistics are treated as
// constants, as in PyTorch); the running statistics are buffers and get none. In eval
// mode save_mean and save_invstd are the running statistics, so batch_norm_backward
// with training=false gives the gradient of the affine map they define.
std::vector<Tensor> batch_norm_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(5);
  const Tensor& g = c.grad(0);
  if (!g.defined() || !(c.needs(0) || c.needs(1) || c.needs(2))) return out;
  const bool training = c.attrs.b("training");
  const double eps = c.attrs.has("eps") ? c.attrs.f("eps") : 1e-5;
  const Tensor weight = c.input_metas[1].defined ? c.input(1) : Tensor();
  NormGrads grads =
      batch_norm_backward(g, c.input(0), weight, c.output(1), c.output(2), training, eps);
  if (c.needs(0)) out[0] = grads.grad_input;
  if (c.needs(1)) out[1] = in_dtype_of(c, 1, grads.grad_weight);
  if (c.needs(2)) out[2] = in_dtype_of(c, 2, grads.grad_bias);
  return out;
}

// layer_norm(input, weight?, bias?) -> (out, mean, rstd); only `out` carries a gradient.
std::vector<Tensor> layer_norm_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(3);
  const Tensor& g = c.grad(0);
  if (!g.defined()) return out;
  const Tensor weight = c.input_metas[1].defined ? c.input(1) : Tensor();
  NormGrads grads = layer_norm_backward(g, c.input(0), c.attrs.ints("normalized_shape"),
                                        c.output(1), c.output(2), weight);
  if (c.needs(0)) out[0] = grads.grad_input;
  if (c.needs(1)) out[1] = in_dtype_of(c, 1, grads.grad_weight);
  if (c.needs(2)) out[2] = in_dtype_of(c, 2, grads.grad_bias);
  return out;
}

// ---- softmax ----

template <bool log>
std::vector<Tensor> softmax_backward_formula(const BackwardContext& c) {
  const Tensor& g = c.grad();
  if (!g.defined() || !c.needs(0)) return {Tensor()};
  const int64_t dim = c.attrs.i("dim");
  return {log ? log_softmax_backward(g, c.output(0), dim) : softmax_backward(g, c.output(0), dim)};
}

// ---- attention ----

// scaled_dot_product_attention(q, k, v, mask?) -> (out, logsumexp, rng_state): only `out`
// carries a gradient, and the mask is a constant (as in PyTorch's fused kernels).
std::vector<Tensor> attention_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(4);
  const Tensor& g = c.grad(0);
  if (!g.defined() || !(c.needs(0) || c.needs(1) || c.needs(2))) return out;
  const Tensor mask = c.input_metas[3].defined ? c.input(3) : Tensor();
  AttentionGrads grads = scaled_dot_product_attention_backward(
      g, c.input(0), c.input(1), c.input(2), mask, c.output(0), c.output(1), c.output(2),
      c.attrs.b("is_causal"), c.attrs.f("dropout_p"), c.attrs.f("scale"));
  if (c.needs(0)) out[0] = grads.grad_q;
  if (c.needs(1)) out[1] = grads.grad_k;
  if (c.needs(2)) out[2] = grads.grad_v;
  return out;
}

// ---- losses ----
// Class-index losses take (log_probs, target, weight?): only log_probs gets a gradient
// (an integer target has none; the class weights are constants, as in PyTorch).

CrossEntropyOptions cross_entropy_options(const BackwardContext& c) {
  CrossEntropyOptions o;
  if (c.input_metas[2].defined) o.weight = c.input(2);
  if (c.attrs.has("ignore_index")) o.ignore_index = c.attrs.i("ignore_index");
  if (c.attrs.has("reduction")) o.reduction = c.attrs.str("reduction");
  if (c.attrs.has("label_smoothing")) o.label_smoothing = c.attrs.f("label_smoothing");
  return o;
}

std::vector<Tensor> nll_loss_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(3);
  const Tensor& g = c.grad();
  if (!g.defined() || !c.needs(0)) return out;
  const CrossEntropyOptions o = cross_entropy_options(c);
  out[0] = nll_loss_backward(
      g, c.input(0), c.input(1),
      {.weight = o.weight, .ignore_index = o.ignore_index, .reduction = o.reduction});
  return out;
}

std::vector<Tensor> cross_entropy_loss_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(3);
  const Tensor& g = c.grad();
  if (!g.defined() || !c.needs(0)) return out;
  out[0] = cross_entropy_loss_backward(g, c.input(0), c.input(1), cross_entropy_options(c));
  return out;
}

// cross_entropy_prob_loss(log_probs, target_probs, weight?). Per element the loss is
// -sum_k weight[k] * t'[k] * log_probs[k] with t' = (1 - ls) * t + ls / C, so
//   d/d log_probs = cross_entropy_prob_loss_backward, and
//   d/d target[k] = -(1 - ls) * weight[k] * log_probs[k] * grad_out (per element, divided by
//                   the element count for "mean").
std::vector<Tensor> cross_entropy_prob_loss_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(3);
  const Tensor& g = c.grad();
  if (!g.defined()) return out;
  const CrossEntropyOptions o = cross_entropy_options(c);
  const Tensor& log_probs = c.input(0);
  if (c.needs(0)) out[0] = cross_entropy_prob_loss_backward(g, log_probs, c.input(1), o);
  if (c.needs(1)) {
    const int64_t class_dim = log_probs.dim() == 1 ? 0 : 1;
    const int64_t classes = log_probs.shape()[static_cast<size_t>(class_dim)];
    Tensor per_element = g;  // grad_out broadcast over the class dim
    if (o.reduction == "none") {
      per_element = g.unsqueeze(class_dim);
    } else if (o.reduction == "mean") {
      const int64_t elements = classes ? log_probs.numel() / classes : 0;
      per_element = g * Scalar(1.0 / static_cast<double>(elements));
    }
    Tensor grad = log_probs * (per_element * Scalar(-(1.0 - o.label_smoothing)));
    if (o.weight.defined()) {
      Shape weight_shape(static_cast<size_t>(log_probs.dim()), 1);
      weight_shape[static_cast<size_t>(class_dim)] = classes;
      grad = grad * o.weight.to(grad.dtype()).reshape(weight_shape);
    }
    out[1] = in_dtype_of(c, 1, grad);
  }
  return out;
}

// linear_cross_entropy(input, weight, bias?, target) -> (loss, correct, log_sum_exp, logits):
// its backward op reads the saved log_sum_exp and logits workspace, so the logits are not
// computed again. The target and the integer count carry no gradient.
std::vector<Tensor> linear_cross_entropy_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(4);
  const Tensor& g = c.grad(0);
  if (!g.defined() || !(c.needs(0) || c.needs(1) || c.needs(2))) return out;
  const LinearCrossEntropyOptions options{.ignore_index = c.attrs.i("ignore_index"),
                                          .reduction = c.attrs.str("reduction")};
  LinearCrossEntropyGrads grads = linear_cross_entropy_backward(
      g.dtype() == c.input_metas[0].dtype ? g : g.to(c.input_metas[0].dtype), c.input(0), c.input(1),
      c.input_metas[2].defined ? c.input(2) : Tensor(), c.input(3), c.output(2), c.output(3), options);
  if (c.needs(0)) out[0] = std::move(grads.grad_input);
  if (c.needs(1)) out[1] = std::move(grads.grad_weight);
  if (c.needs(2)) out[2] = std::move(grads.grad_bias);
  return out;
}

// mse_loss(input, target) broadcasts its operands: d/d input = mse_loss_backward (in the
// broadcast shape), d/d target its negation, each summed back to its operand's shape.
std::vector<Tensor> mse_loss_backward_formula(const BackwardContext& c) {
  std::vector<Tensor> out(2);
  const Tensor& g = c.grad();
  if (!g.defined() || !(c.needs(0) || c.needs(1))) return out;
  const std::string reduction = c.attrs.has("reduction") ? c.attrs.str("reduction") : "mean";
  const Tensor grad = mse_loss_backward(g, c.input(0), c.input(1), reduction);
  if (c.needs(0)) out[0] = in_dtype_of(c, 0, sum_to(grad, c.input_metas[0].shape));
  if (c.needs(1)) out[1] = in_dtype_of(c, 1, sum_to(neg(grad), c.input_metas[1].shape));
  return out;
}

struct Registrar {
  Registrar() {
    register_backward("conv2d", {.fn = conv2d_backward, .unsaved_inputs = {2}});
    register_backward(
        "max_pool2d",
        {.fn = max_pool2d_backward_formula, .saves_inputs = false, .saves_outputs = true});
    register_backward("avg_pool2d", {.fn = avg_pool2d_backward_formula, .saves_inputs = false});
    register_backward("adaptive_avg_pool2d",
                      {.fn = adaptive_avg_pool2d_backward_formula, .saves_inputs = false});
    // The running statistics (inputs 3 and 4) are not read by the formula, and a layer used
    // twice before backward updates them again: don't save them.
    register_backward("batch_norm", {.fn = batch_norm_backward_formula,
                                     .saves_outputs = true,
                                     .unsaved_inputs = {3, 4}});
    register_backward("layer_norm", {.fn = layer_norm_backward_formula, .saves_outputs = true});
    register_backward(
        "softmax",
        {.fn = softmax_backward_formula<false>, .saves_inputs = false, .saves_outputs = true});
    register_backward(
        "log_softmax",
        {.fn = softmax_backward_formula<true>, .saves_inputs = false, .saves_outputs = true});
    register_backward("scaled_dot_product_attention",
                      {.fn = attention_backward_formula, .saves_outputs = true});
    register_backward("nll_loss", {.fn = nll_loss_backward_formula});
    register_backward("cross_entropy_loss", {.fn = cross_entropy_loss_backward_formula});
    register_backward("cross_entropy_prob_loss", {.fn = cross_entropy_prob_loss_backward_formula});
    register_backward("mse_loss", {.fn = mse_loss_backward_formula});
    register_backward("linear_cross_entropy",
                      {.fn = linear_cross_entropy_backward_formula, .saves_outputs = true});
  }
} registrar;

}  // namespace
}  // namespace kiln
