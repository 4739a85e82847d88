// Backward formulas of the reductions. The output gradient is first given the input's rank
// (keepdim shape) so that it broadcasts against the input.
#include "core/ops/reduce.h"

#include <cmath>

#include "autograd/formula.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/indexing.h"

namespace kiln {
namespace {

// What a reduction call reduced, read from its attributes.
struct Reduction {
  Shape in_shape;
  DimList dims;      // as given: empty reduces everything
  Shape kept_shape;  // the result's shape with keepdim
  bool keepdim = false;
  int64_t count = 1;  // elements per reduced slice
};

Reduction reduction_of(const BackwardContext& c, DimList dims) {
  Reduction r;
  r.in_shape = c.input_metas[0].shape;
  r.dims = std::move(dims);
  r.keepdim = c.attrs.has("keepdim") && c.attrs.b("keepdim");
  const std::vector<bool> reduced = reduced_dims(r.in_shape, r.dims, c.op.name.c_str());
  r.kept_shape = reduced_shape(r.in_shape, reduced, true);
  for (size_t d = 0; d < reduced.size(); ++d)
    if (reduced[d]) r.count *= r.in_shape[d];
  return r;
}

// For ops with a `dims` list attribute.
Reduction dims_reduction(const BackwardContext& c) {
  return reduction_of(c, c.attrs.has("dims") ? c.attrs.ints("dims") : DimList{});
}

// t (a result of the reduction) in the keepdim shape.
Tensor kept(const Tensor& t, const Reduction& r) { return r.keepdim ? t : t.reshape(r.kept_shape); }

// The gradient in the input's dtype (sum and mean may accumulate in another).
Tensor as_input_dtype(const Tensor& g, const BackwardContext& c) {
  const DType t = c.input_metas[0].dtype;
  return g.dtype() == t ? g : g.to(t);
}

// The op's saved result in keepdim shape; recomputed from the input when a graph of the
// backward is being recorded, since saved outputs carry no graph.
template <class Recompute>
Tensor result_kept(const BackwardContext& c, const Reduction& r, Recompute recompute) {
  if (GradMode::is_enabled()) return recompute();
  return kept(c.output(0), r);
}

std::vector<Tensor> sum_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  return {as_input_dtype(kept(c.grad(), r).expand(r.in_shape), c)};
}

std::vector<Tensor> mean_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  Tensor g = kept(c.grad(), r).expand(r.in_shape) / static_cast<double>(r.count);
  return {as_input_dtype(g, c)};
}

// d prod / d x_i is the product of the other elements: prod / x_i when x_i != 0; for a zero,
// the product of the nonzero others when it is the slice's only zero, else 0.
std::vector<Tensor> prod_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  const Tensor& x = c.input(0);
  const Tensor is_zero = x == 0;
  const Tensor zero_count = sum(is_zero, r.dims, true);
  const Tensor prod_nonzero = prod(where(is_zero, 1, x), r.dims, true);
  const Tensor result = prod(x, r.dims, true);
  const Tensor others = where(is_zero, where(zero_count == 1, prod_nonzero, 0), result / x);
  return {as_input_dtype(kept(c.grad(), r) * others, c)};
}

// The gradient split evenly among the elements equal to the extreme value (as PyTorch).
Tensor even_split(const Tensor& g_kept, const Tensor& is_extreme, const Reduction& r) {
  const Tensor count = sum(is_extreme, r.dims, true);
  return where(is_extreme, g_kept / count, 0);
}

// amax, amin, and max and min without a dim.
std::vector<Tensor> extreme_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  const Tensor& x = c.input(0);
  return {even_split(kept(c.grad(), r), x == kept(c.output(0), r), r)};
}

// max and min: with a dim the gradient goes to the index; without one, as amax.
std::vector<Tensor> max_min_backward(const BackwardContext& c) {
  if (!c.attrs.has("dim")) return extreme_backward(c);
  const Reduction r = reduction_of(c, {c.attrs.i("dim")});
  const Tensor& g = c.grad();
  if (r.in_shape.empty()) return {g};
  const int64_t d =
      wrap_dim(c.attrs.i("dim"), static_cast<int64_t>(r.in_shape.size()), c.op.name.c_str());
  const Tensor zero = zeros(r.in_shape, {.dtype = g.dtype(), .device = g.device()});
  return {scatter_add(zero, d, kept(c.output(1), r), kept(g, r))};
}

// d var / dx = 2 (x - mean) / (n - correction).
Tensor var_grad(const BackwardContext& c, const Reduction& r, const Tensor& g_kept) {
  const Tensor& x = c.input(0);
  const double divisor = std::max(0.0, static_cast<double>(r.count) - c.attrs.f("correction"));
  return g_kept * (x - mean(x, r.dims, true)) * (2.0 / divisor);
}

std::vector<Tensor> var_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  return {var_grad(c, r, kept(c.grad(), r))};
}

// std = sqrt(var): d std = d var / (2 std); a zero std gives a zero gradient.
std::vector<Tensor> std_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  const Tensor out = result_kept(
      c, r, [&] { return kiln::std(c.input(0), r.dims, c.attrs.f("correction"), true); });
  const Tensor g_var = where(out == 0, 0, kept(c.grad(), r) / (out * 2));
  return {var_grad(c, r, g_var)};
}

std::vector<Tensor> logsumexp_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  const Tensor& x = c.input(0);
  const Tensor out = result_kept(c, r, [&] { return logsumexp(x, r.dims, true); });
  return {kept(c.grad(), r) * exp(x - out)};
}

// d ||x||_p = sign(x) |x|^(p-1) / ||x||^(p-1); p = 2 and p = 1 simplify; the inf norms
// act as amax / amin of |x|; p = 0 counts nonzeros and has zero gradient. Where the
// norm is zero the gradient is zero.
std::vector<Tensor> norm_backward(const BackwardContext& c) {
  const Reduction r = dims_reduction(c);
  const Tensor& x = c.input(0);
  const double p = c.attrs.f("p");
  const Tensor g = kept(c.grad(), r);
  if (p == 0) return {zeros(r.in_shape, {.dtype = x.dtype(), .device = x.device()})};
  if (p == 1) return {g * sign(x)};
  const Tensor out = result_kept(c, r, [&] { return norm(x, p, r.dims, true); });
  if (std::isinf(p)) return {even_split(g, abs(x) == out, r) * sign(x)};
  if (p == 2) return {where(out == 0, 0, g / out) * x};
  const Tensor scale = where(out == 0, 0, g / pow(out, p - 1));
  return {where(x == 0, 0, sign(x) * pow(abs(x), p - 1) * scale)};
}

struct Registrar {
  Registrar() {
    register_backward("sum", {.fn = sum_backward, .saves_inputs = false});
    register_backward("mean", {.fn = mean_backward, .saves_inputs = false});
    register_backward("prod", {.fn = prod_backward});
    register_backward("amax", {.fn = extreme_backward, .saves_outputs = true});
    register_backward("amin", {.fn = extreme_backward, .saves_outputs = true});
    register_backward("max", {.fn = max_min_backward, .saves_outputs = true});
    register_backward("min", {.fn = max_min_backward, .saves_outputs = true});
    register_backward("var", {.fn = var_backward});
    register_backward("std", {.fn = std_backward, .saves_outputs = true});
    register_backward("logsumexp", {.fn = logsumexp_backward, .saves_outputs = true});
    register_backward("norm", {.fn = norm_backward, .saves_outputs = true});
  }
} registrar;

}  // namespace
}  // namespace kiln
