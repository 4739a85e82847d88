// Backward formulas of the matrix products: for C = A B, dA = dC B^T and dB = A^T dC, with
// 1-d operands promoted to matrices and broadcast batch dims summed back.
#include "core/ops/linalg.h"

#include "autograd/formula.h"
#include "core/ops/elementwise.h"

namespace kiln {
namespace {

bool is_one(Scalar s) { return s.to_double() == 1.0; }

// Whether t's matrices are stored transposed (column-major), as a Linear's weight.t() is.
bool stored_transposed(const Tensor& t) {
  if (t.dim() < 2 || t.is_contiguous()) return false;
  const int64_t d = t.dim();
  return t.strides()[static_cast<size_t>(d - 2)] == 1 && t.strides()[static_cast<size_t>(d - 1)] == t.size(-2);
}

// The product x y, laid out like `like`: (y^T x^T)^T when like is stored transposed. An
// operand's gradient then has the operand's strides, so a Linear weight's own gradient
// (through t()'s backward) comes out contiguous, which AccumulateGrad keeps without a copy;
// computed as x y it would need a transposing copy of the whole weight every step.
template <typename Product>
Tensor product_like(const Tensor& like, const Tensor& x, const Tensor& y, Product product) {
  if (!stored_transposed(like)) return product(x, y);
  return product(y.transpose(-1, -2), x.transpose(-1, -2)).transpose(-1, -2);
}

// matmul: a 1-d left operand is a row [1, k], a 1-d right operand a column [k, 1]; the
// gradient gets those dims back, the products run as batched matmuls, and each operand's
// gradient is summed over the batch dims it was broadcast along.
std::vector<Tensor> matmul_backward(const BackwardContext& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  const bool a_vector = a.dim() == 1, b_vector = b.dim() == 1;
  const Tensor a2 = a_vector ? a.unsqueeze(0) : a;
  const Tensor b2 = b_vector ? b.unsqueeze(-1) : b;
  Tensor g = c.grad();
  if (b_vector) g = g.unsqueeze(-1);
  if (a_vector) g = g.unsqueeze(-2);
  std::vector<Tensor> out(2);
  auto product = [](const Tensor& x, const Tensor& y) { return matmul(x, y); };
  if (c.needs(0))
    out[0] = sum_to(product_like(a2, g, b2.transpose(-1, -2), product), a2.shape()).reshape(a.shape());
  if (c.needs(1)) {
    if (b2.dim() == 2 && a2.dim() > 2) {
      // A matrix shared by a stack (a Linear's weight under [N, L, in] inputs): one product
      // over the stack's rows, [k, rows] @ [rows, n], instead of a product per matrix of
      // the stack and their sum (the stack's size times the gradient's memory, and a
      // reduction over it: 2x a BERT step's time on the CPU).
      const Tensor rows_a = a2.reshape({-1, a2.size(-1)}), rows_g = g.reshape({-1, g.size(-1)});
      out[1] = product_like(b2, rows_a.transpose(0, 1), rows_g, product).reshape(b.shape());
    } else {
      out[1] = sum_to(product_like(b2, a2.transpose(-1, -2), g, product), b2.shape()).reshape(b.shape());
    }
  }
  return out;
}

std::vector<Tensor> mm_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  auto product = [](const Tensor& x, const Tensor& y) { return mm(x, y); };
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = product_like(c.input(0), g, c.input(1).t(), product);
  if (c.needs(1)) out[1] = product_like(c.input(1), c.input(0).t(), g, product);
  return out;
}

std::vector<Tensor> bmm_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  std::vector<Tensor> out(2);
  if (c.needs(0)) out[0] = bmm(g, c.input(1).transpose(1, 2));
  if (c.needs(1)) out[1] = bmm(c.input(0).transpose(1, 2), g);
  return out;
}

// addmm = beta bias + alpha (a @ b): the bias gradient is beta g summed to its broadcast
// shape, the operands' are alpha times mm's.
std::vector<Tensor> addmm_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  const Scalar beta = c.attrs.has("beta") ? c.attrs.scalar("beta") : Scalar(1);
  const Scalar alpha = c.attrs.has("alpha") ? c.attrs.scalar("alpha") : Scalar(1);
  const Tensor ga = is_one(alpha) ? g : g * alpha;
  std::vector<Tensor> out(3);
  if (c.needs(0)) out[0] = sum_to(is_one(beta) ? g : g * beta, c.input_metas[0].shape);
  auto product = [](const Tensor& x, const Tensor& y) { return mm(x, y); };
  if (c.needs(1)) out[1] = product_like(c.input(1), ga, c.input(2).t(), product);
  if (c.needs(2)) out[2] = product_like(c.input(2), c.input(1).t(), ga, product);
  return out;
}

struct Registrar {
  Registrar() {
    register_backward("matmul", {.fn = matmul_backward});
    register_backward("mm", {.fn = mm_backward});
    register_backward("bmm", {.fn = bmm_backward});
    register_backward("addmm", {.fn = addmm_backward, .unsaved_inputs = {0}});
  }
} registrar;

}  // namespace
}  // namespace kiln
