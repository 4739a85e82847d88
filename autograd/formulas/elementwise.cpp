// Backward formulas of the elementwise ops.
//
// Each formula returns, for every input that needs one, a gradient summed back to that
// input's shape (inputs broadcast) and converted to its dtype (an f32 input of an f64
// result gets an f32 gradient, as PyTorch's engine does). Wrapped numbers never require
// grad, so ctx.needs() is false for them and their gradient stays undefined.
#include <cmath>
#include <numbers>

#include "autograd/formula.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"

namespace kiln {
namespace {

// The gradient `g` of the op's output, as the gradient of input i.
Tensor to_input(const BackwardContext& c, size_t i, const Tensor& g) {
  const TensorMeta& meta = c.input_metas[i];
  Tensor r = sum_to(g, meta.shape);
  if (r.dtype() != meta.dtype) r = r.to(meta.dtype);
  return r.device() == meta.device ? r : r.to(meta.device);
}

// A unary op's formula from the function giving its input's gradient.
template <Tensor (*input_grad)(const BackwardContext&)>
std::vector<Tensor> unary(const BackwardContext& c) {
  return {c.needs(0) ? to_input(c, 0, input_grad(c)) : Tensor()};
}

// ---- unary ----

Tensor pass_grad(const BackwardContext& c) { return c.grad(); }  // clone, cast
Tensor neg_grad(const BackwardContext& c) { return -c.grad(); }
// abs' slope is sign(x), 0 at 0 (PyTorch's choice).
Tensor abs_grad(const BackwardContext& c) { return c.grad() * sign(c.input(0)); }
Tensor sign_grad(const BackwardContext& c) { return zeros_like(c.grad()); }
Tensor exp_grad(const BackwardContext& c) { return c.grad() * c.output(0); }
Tensor log_grad(const BackwardContext& c) { return c.grad() / c.input(0); }
Tensor log1p_grad(const BackwardContext& c) { return c.grad() / (c.input(0) + 1); }
Tensor expm1_grad(const BackwardContext& c) { return c.grad() * (c.output(0) + 1); }
// d sqrt(x) = 1 / (2 sqrt(x)).
Tensor sqrt_grad(const BackwardContext& c) { return c.grad() / (c.output(0) * 2); }
// d x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2.
Tensor rsqrt_grad(const BackwardContext& c) {
  const Tensor& y = c.output(0);
  return c.grad() * (y * y * y) * -0.5;
}
// d (1/x) = -1/x^2 = -y^2.
Tensor reciprocal_grad(const BackwardContext& c) {
  const Tensor& y = c.output(0);
  return -c.grad() * (y * y);
}
Tensor sin_grad(const BackwardContext& c) { return c.grad() * cos(c.input(0)); }
Tensor cos_grad(const BackwardContext& c) { return -c.grad() * sin(c.input(0)); }
Tensor tanh_grad(const BackwardContext& c) {
  const Tensor& y = c.output(0);
  return c.grad() * (1 - y * y);
}
Tensor sigmoid_grad(const BackwardContext& c) {
  const Tensor& y = c.output(0);
  return c.grad() * (y * (1 - y));
}
// relu passes the gradient where the output is positive (0 at 0, as PyTorch).
Tensor relu_grad(const BackwardContext& c) { return where(c.output(0) > 0, c.grad(), 0); }

// d gelu is one op, gelu_backward (kernels/scalar.h has its arithmetic).
bool gelu_tanh_form(const BackwardContext& c) {
  return c.attrs.has("approximate") && c.attrs.str("approximate") == "tanh";
}
Tensor gelu_grad(const BackwardContext& c) {
  return gelu_backward(c.grad(), c.input(0), gelu_tanh_form(c) ? "tanh" : "none");
}

// gelu's second derivative, for gelu_backward's own formula. Exact: d (Phi + x phi) =
// phi (2 - x^2). Tanh form: with t = tanh(u), u' = k (1 + 3 a x^2), u'' = 6 k a x, the
// derivative of (1 + t) / 2 + x (1 - t^2) u' / 2 is (1 - t^2) (u' - x t u'^2 + x u'' / 2).
Tensor gelu_second_derivative(const Tensor& x, bool tanh_form) {
  constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1 / sqrt(2 pi)
  Tensor x2 = x * x;
  if (!tanh_form) return exp(x2 * -0.5) * kInvSqrt2Pi * (2 - x2);
  constexpr double kA = 0.044715;
  const double k = std::sqrt(2.0 / std::numbers::pi);
  Tensor t = tanh((x + x2 * x * kA) * k);
  Tensor du = (x2 * (3 * kA) + 1) * k;
  return (1 - t * t) * (du - x * t * du * du + x2 * (3 * k * kA));
}

// gelu_backward(g, x) = g gelu'(x): d/dg = gelu'(x), d/dx = g gelu''(x).
std::vector<Tensor> gelu_backward_backward(const BackwardContext& c) {
  const bool tanh_form = gelu_tanh_form(c);
  const Tensor& x = c.input(1);
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, gelu_backward(c.grad(), x, tanh_form ? "tanh" : "none"));
  if (c.needs(1)) out[1] = to_input(c, 1, c.grad() * c.input(0) * gelu_second_derivative(x, tanh_form));
  return out;
}

// silu(x) = x s(x): slope s (1 + x (1 - s)).
Tensor silu_grad(const BackwardContext& c) {
  const Tensor& x = c.input(0);
  Tensor s = sigmoid(x);
  return c.grad() * (s * (x * (1 - s) + 1));
}

// softplus is the identity where beta x > threshold, else log(1 + e^(beta x)) / beta,
// whose slope is sigmoid(beta x).
Tensor softplus_grad(const BackwardContext& c) {
  const double beta = c.attrs.has("beta") ? c.attrs.f("beta") : 1.0;
  const double threshold = c.attrs.has("threshold") ? c.attrs.f("threshold") : 20.0;
  Tensor bx = c.input(0) * beta;
  return where(bx > threshold, c.grad(), c.grad() * sigmoid(bx));
}

// clamp passes the gradient where min <= x <= max, bounds included (PyTorch's rule).
Tensor clamp_grad(const BackwardContext& c) {
  const Tensor& x = c.input(0);
  Tensor keep;
  if (auto min = c.attrs.optional_scalar("min")) keep = x >= *min;
  if (auto max = c.attrs.optional_scalar("max")) {
    Tensor below = x <= *max;
    keep = keep.defined() ? logical_and(keep, below) : below;
  }
  return where(keep, c.grad(), 0);
}

// ---- binary ----

// d(a + alpha b) = (g, alpha g), each summed back to its input's broadcast shape.
template <bool subtract>
std::vector<Tensor> add_sub_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  Scalar alpha = c.attrs.has("alpha") ? c.attrs.scalar("alpha") : Scalar(1);
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, g);
  if (c.needs(1)) {
    Tensor gb = alpha.is_floating() || alpha.to_int() != 1 ? g * alpha : g;
    out[1] = to_input(c, 1, subtract ? -gb : gb);
  }
  return out;
}

std::vector<Tensor> mul_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, g * c.input(1));
  if (c.needs(1)) out[1] = to_input(c, 1, g * c.input(0));
  return out;
}

// d(a / b) = (g / b, -g a / b^2).
std::vector<Tensor> div_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  const Tensor& b = c.input(1);
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, g / b);
  if (c.needs(1)) out[1] = to_input(c, 1, -g * c.input(0) / (b * b));
  return out;
}

// d(a^b) = (b a^(b-1), a^b log a). As in PyTorch, the first is 0 where b == 0 (not
// 0 * 0^-1) and the second is 0 where a == 0 and b >= 0 (not 0 * log 0).
std::vector<Tensor> pow_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  const Tensor& a = c.input(0);
  const Tensor& b = c.input(1);
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, where(b == 0, 0, g * b * pow(a, b - 1)));
  if (c.needs(1)) {
    const Tensor& y = c.output(0);
    // log of the base in the result's precision (a wrapped integer base would give f32).
    Tensor log_a = log(a.dtype() == y.dtype() ? a : a.to(y.dtype()));
    Tensor zero_base = logical_and(a == 0, b >= 0);
    out[1] = to_input(c, 1, where(zero_base, 0, g * y * log_a));
  }
  return out;
}

// maximum and minimum: the gradient goes to the selected input; ties split it evenly.
// A NaN compares false either way, so both inputs get it (PyTorch's result).
template <bool is_max>
std::vector<Tensor> max_min_backward(const BackwardContext& c) {
  const Tensor& a = c.input(0);
  const Tensor& b = c.input(1);
  Tensor half = where(a == b, c.grad() * 0.5, c.grad());
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = to_input(c, 0, where(is_max ? a < b : a > b, 0, half));
  if (c.needs(1)) out[1] = to_input(c, 1, where(is_max ? a > b : a < b, 0, half));
  return out;
}

// where(cond, a, b): the gradient goes to the selected input; the condition gets none.
std::vector<Tensor> where_backward(const BackwardContext& c) {
  const Tensor& cond = c.input(0);
  std::vector<Tensor> out(3);
  if (c.needs(1)) out[1] = to_input(c, 1, where(cond, c.grad(), 0));
  if (c.needs(2)) out[2] = to_input(c, 2, where(cond, 0, c.grad()));
  return out;
}

// Formulas that read none of the forward tensors, or only the output.
BackwardFormula reads_nothing(BackwardFormula::Fn fn) { return {.fn = fn, .saves_inputs = false}; }
BackwardFormula reads_output(BackwardFormula::Fn fn) {
  return {.fn = fn, .saves_inputs = false, .saves_outputs = true};
}

struct Registrar {
  Registrar() {
    register_backward("neg", reads_nothing(unary<neg_grad>));
    register_backward("abs", {.fn = unary<abs_grad>});
    register_backward("sign", reads_nothing(unary<sign_grad>));
    register_backward("exp", reads_output(unary<exp_grad>));
    register_backward("log", {.fn = unary<log_grad>});
    register_backward("log1p", {.fn = unary<log1p_grad>});
    register_backward("expm1", reads_output(unary<expm1_grad>));
    register_backward("sqrt", reads_output(unary<sqrt_grad>));
    register_backward("rsqrt", reads_output(unary<rsqrt_grad>));
    register_backward("reciprocal", reads_output(unary<reciprocal_grad>));
    register_backward("sin", {.fn = unary<sin_grad>});
    register_backward("cos", {.fn = unary<cos_grad>});
    register_backward("tanh", reads_output(unary<tanh_grad>));
    register_backward("sigmoid", reads_output(unary<sigmoid_grad>));
    register_backward("relu", reads_output(unary<relu_grad>));
    register_backward("gelu", {.fn = unary<gelu_grad>});
    register_backward("gelu_backward", {.fn = gelu_backward_backward});
    register_backward("silu", {.fn = unary<silu_grad>});
    register_backward("softplus", {.fn = unary<softplus_grad>});
    register_backward("clamp", {.fn = unary<clamp_grad>});
    register_backward("cast", reads_nothing(unary<pass_grad>));
    register_backward("clone", reads_nothing(unary<pass_grad>));
    register_backward("to_device", reads_nothing(unary<pass_grad>));  // back to the input's device
    register_backward("fill", reads_nothing(unary<sign_grad>));  // the result ignores the input

    register_backward("add", reads_nothing(add_sub_backward<false>));
    register_backward("sub", reads_nothing(add_sub_backward<true>));
    register_backward("mul", {.fn = mul_backward});
    register_backward("div", {.fn = div_backward});
    register_backward("pow", {.fn = pow_backward, .saves_outputs = true});
    register_backward("maximum", {.fn = max_min_backward<true>});
    register_backward("minimum", {.fn = max_min_backward<false>});
    register_backward("where", {.fn = where_backward, .unsaved_inputs = {1, 2}});
  }
} registrar;

}  // namespace
}  // namespace kiln
