// Backward formulas of the matrix products, checked with gradcheck in f64 (eps 1e-6,
// atol 1e-5, rtol 1e-3: gradcheck's defaults) over torch.matmul's shape cases, broadcast
// batch dims and transposed (non-contiguous) operands.
#include "autograd/gradcheck.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void check_grad(const Fn& fn, const std::vector<Tensor>& inputs) {
  CHECK_NOTHROW(gradcheck(fn, inputs));
}

const Fn kMatmul = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };

}  // namespace

TEST_CASE("matmul gradients for vector and matrix operands", "[formulas-tensor]") {
  check_grad(kMatmul, {random_leaf({3}), random_leaf({3}, 3)});     // dot
  check_grad(kMatmul, {random_leaf({3}), random_leaf({3, 2}, 3)});  // row @ matrix
  check_grad(kMatmul, {random_leaf({2, 3}), random_leaf({3}, 3)});  // matrix @ column
  check_grad(kMatmul, {random_leaf({2, 3}), random_leaf({3, 4}, 3)});
  check_grad(kMatmul, {random_transposed_leaf({2, 3}), random_transposed_leaf({3, 4}, 3)});
}

TEST_CASE("matmul gradients for stacks and broadcast batch dims", "[formulas-tensor]") {
  check_grad(kMatmul, {random_leaf({2, 2, 3}), random_leaf({3}, 3)});
  check_grad(kMatmul, {random_leaf({3}), random_leaf({2, 3, 2}, 3)});
  check_grad(kMatmul, {random_leaf({2, 2, 3}), random_leaf({3, 2}, 3)});
  check_grad(kMatmul, {random_leaf({2, 3}), random_transposed_leaf({2, 3, 2}, 3)});
  check_grad(kMatmul, {random_leaf({2, 1, 2, 3}), random_leaf({3, 3, 2}, 3)});
  check_grad(kMatmul, {random_transposed_leaf({1, 2, 3}), random_leaf({2, 1, 3, 2}, 3)});
  // A matrix shared by the whole batch (a Linear on [N, L, in]): its gradient is one
  // product over the stacked rows; a weight.t() operand keeps its transposed layout.
  check_grad(kMatmul, {random_leaf({2, 3, 4}), random_transposed_leaf({4, 2}, 3)});
  check_grad(kMatmul, {random_transposed_leaf({2, 2, 3, 4}), random_leaf({4, 2}, 3)});
  check_grad(kMatmul, {random_leaf({2, 2, 1, 3}), random_leaf({3, 2}, 3)});
  // Only one operand needs a gradient.
  check_grad(kMatmul, {random_leaf({2, 3}), randn({2, 3, 2}, {.dtype = DType::f64})});
}

TEST_CASE("a matrix shared by a stack gets its gradient from one product, not a stack of them",
          "[formulas-tensor]") {
  // A Linear's weight under a [N, L, in] input: the gradient is [in, out] from the stack's
  // rows at once. Computed per matrix of the stack and summed, it would take the stack's
  // size times the gradient's memory: the peak during backward tells them apart.
  check_grad(kMatmul, {random_leaf({2, 3, 2, 3}), random_transposed_leaf({3, 2}, 3)});
  const int64_t stack = 64, in = 32, out = 48;
  Tensor x = randn({stack, 2, in}).requires_grad_(), w = randn({out, in}).requires_grad_();
  Tensor y = matmul(x, w.t());
  const Tensor dy = randn(y.shape());
  const int64_t before = memory_stats().allocated;
  reset_peak_memory();
  y.backward(dy);
  const int64_t stacked = stack * in * out * 4;  // bytes of the per-matrix products
  CHECK(memory_stats().peak - before < stacked / 4);
  NoGradGuard no_grad;
  KILN_CHECK_CLOSE(w.grad(), mm(dy.reshape({-1, out}).t().contiguous(), x.reshape({-1, in})), 1e-4, 1e-5);
}

TEST_CASE("mm and bmm gradients", "[formulas-tensor]") {
  check_grad([](const auto& in) { return mm(in[0], in[1]); },
             {random_leaf({2, 3}), random_transposed_leaf({3, 2})});
  check_grad([](const auto& in) { return bmm(in[0], in[1]); },
             {random_transposed_leaf({2, 2, 3}), random_leaf({2, 3, 2})});
}

TEST_CASE("addmm gradients scale by beta and alpha", "[formulas-tensor]") {
  for (const Shape& bias : {Shape{2, 4}, Shape{4}, Shape{1, 4}, Shape{2, 1}, Shape{}}) {
    INFO("bias " << shape_str(bias));
    check_grad([](const auto& in) { return addmm(in[0], in[1], in[2]); },
               {random_leaf(bias), random_leaf({2, 3}, 3), random_leaf({3, 4}, 4)});
    check_grad([](const auto& in) { return addmm(in[0], in[1], in[2], 0.5, -2.0); },
               {random_leaf(bias), random_transposed_leaf({2, 3}, 3), random_leaf({3, 4}, 4)});
  }
  Tensor bias = random_leaf({4});
  addmm(bias, random_leaf({2, 3}), random_leaf({3, 4}), 0).backward(ones({2, 4}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(bias.grad(), zeros({4}));
}

TEST_CASE("matmul gradients are differentiable under create_graph", "[formulas-tensor]") {
  // gradcheck of the first derivative checks the second. The inner backward also reaches
  // b, whose .grad gradcheck reads later: it is restored.
  Fn first_grad = [](const std::vector<Tensor>& in) {
    EnableGradGuard enable;
    const Tensor &a = in[0], &b = in[1];
    const Tensor b_grad = b.grad();
    Tensor y = matmul(matmul(a, a), b);
    a.set_grad({});
    y.backward(ones_like(y), false, /*create_graph=*/true);
    Tensor g = a.grad();
    a.set_grad({});
    b.set_grad(b_grad);
    return g;
  };
  check_grad(first_grad, {random_leaf({2, 3, 3}), random_leaf({3}, 3)});
}
