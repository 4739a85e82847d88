// Backward formulas of the elementwise ops.
#include "autograd/formula.h"
#include "core/ops/elementwise.h"

namespace kiln {
namespace {

// d(a + alpha b) = (g, alpha g), each summed back to its input's broadcast shape.
template <bool subtract>
std::vector<Tensor> add_sub_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  Scalar alpha = c.attrs.has("alpha") ? c.attrs.scalar("alpha") : Scalar(1);
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = sum_to(g, c.input_metas[0].shape);
  if (c.needs(1)) {
    Tensor gb = alpha.is_floating() || alpha.to_int() != 1 ? g * alpha : g;
    out[1] = sum_to(subtract ? -gb : gb, c.input_metas[1].shape);
  }
  return out;
}

std::vector<Tensor> mul_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = sum_to(g * c.input(1), c.input_metas[0].shape);
  if (c.needs(1)) out[1] = sum_to(g * c.input(0), c.input_metas[1].shape);
  return out;
}

struct Registrar {
  Registrar() {
    register_backward("add", {.fn = add_sub_backward<false>, .saves_inputs = false});
    register_backward("sub", {.fn = add_sub_backward<true>, .saves_inputs = false});
    register_backward("mul", {.fn = mul_backward});
  }
} registrar;

}  // namespace
}  // namespace kiln
