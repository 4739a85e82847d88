// The autograd engine: graphs, accumulation, retain_graph, hooks, grad modes, detach,
// version counters, in-place rules. Uses add, sub and mul, whose formulas are simplest.
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
Tensor leaf(std::vector<double> v, Shape shape) {
  Tensor t = tensor_of(v, shape, DType::f64);
  t.requires_grad_();
  return t;
}
}  // namespace

TEST_CASE("backward computes gradients through a small graph", "[autograd]") {
  Tensor a = leaf({1, 2, 3}, {3}), b = leaf({4, 5, 6}, {3});
  Tensor y = a * b + a;  // dy/da = b + 1, dy/db = a
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn()->name() == "add_backward");
  y.backward(ones({3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({5, 6, 7}, {3}));
  KILN_CHECK_EQUAL(b.grad(), tensor_of({1, 2, 3}, {3}));
}

TEST_CASE("gradients accumulate across backward calls and reach shared inputs once each", "[autograd]") {
  Tensor a = leaf({2}, {1});
  Tensor y = a * a * a;  // 3 a^2 = 12
  y.backward(ones({1}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({12}, {1}));
  Tensor z = a * 3;
  z.backward(ones({1}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({15}, {1}));
  a.set_grad({});
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("broadcast inputs get gradients summed back to their shape", "[autograd]") {
  Tensor a = leaf({1, 2, 3, 4, 5, 6}, {2, 3}), b = leaf({10, 20, 30}, {3}), s = leaf({2}, Shape{});
  Tensor y = a * b - s;
  y.backward(ones({2, 3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(b.grad(), tensor_of({5, 7, 9}, {3}));
  KILN_CHECK_EQUAL(s.grad(), tensor_of({-6}, Shape{}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({10, 20, 30, 10, 20, 30}, {2, 3}));
}

TEST_CASE("a one-element output implies a gradient of one / others need one", "[autograd]") {
  Tensor a = leaf({3}, Shape{});
  (a * a).backward();
  KILN_CHECK_EQUAL(a.grad(), tensor_of({6}, Shape{}));
  Tensor v = leaf({1, 2}, {2});
  CHECK_THROWS_WITH((v * v).backward(), Catch::Contains("backward") && Catch::Contains("one-element"));
  CHECK_THROWS_WITH(ones({2}).backward(), Catch::Contains("does not require grad"));
}

TEST_CASE("a second backward needs retain_graph", "[autograd]") {
  Tensor a = leaf({2}, {1});
  Tensor y = a * a;
  y.backward(ones({1}, {.dtype = DType::f64}), /*retain_graph=*/true);
  y.backward(ones({1}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({8}, {1}));
  CHECK_THROWS_WITH(y.backward(ones({1}, {.dtype = DType::f64})), Catch::Contains("retain_graph"));
}

TEST_CASE("NoGradGuard records nothing / EnableGradGuard records inside it", "[autograd]") {
  Tensor a = leaf({1}, {1});
  {
    NoGradGuard no_grad;
    Tensor y = a * 2;
    CHECK_FALSE(y.requires_grad());
    {
      EnableGradGuard enable;
      CHECK((a * 2).requires_grad());
    }
  }
  CHECK((a * 2).requires_grad());
  CHECK_FALSE(a.detach().requires_grad());
  CHECK(a.detach().storage() == a.storage());
}

TEST_CASE("modifying a saved tensor in place is caught at backward", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = a * 1.0;  // a non-leaf
  Tensor y = b * b;    // saves b
  b.add_(1);
  CHECK_THROWS_WITH(y.backward(ones({2}, {.dtype = DType::f64})),
                    Catch::Contains("mul") && Catch::Contains("modified by an in-place"));
}

TEST_CASE("in-place ops: an error on leaves that require grad / recorded on non-leaves", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  CHECK_THROWS_WITH(a.add_(1), Catch::Contains("leaf") && Catch::Contains("in-place"));
  KILN_CHECK_EQUAL(a, tensor_of({1, 2}, {2}));  // refused before writing anything
  {
    NoGradGuard no_grad;
    a.add_(1);  // fine without grad: an optimizer step
  }
  Tensor b = a * 2;  // [4, 6]
  b.mul_(a);         // b = 2 a^2, db/da = 4 a
  b.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({8, 12}, {2}));
}

TEST_CASE("hooks see and may replace gradients / post-accumulate hooks run after", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = a * 3;
  Tensor seen;
  b.register_hook([&](const Tensor& g) {
    seen = g;
    return g * 2;  // doubles what flows on
  });
  int calls = 0;
  a.register_post_accumulate_grad_hook([&](const Tensor& t) {
    ++calls;
    CHECK(t.grad().defined());
  });
  const int h = a.register_hook([](const Tensor& g) { return g + 1; });
  b.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(seen, tensor_of({1, 1}, {2}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({7, 7}, {2}));
  CHECK(calls == 1);
  a.remove_hook(h);
  a.set_grad({});
  (a * 3).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({3, 3}, {2}));
}

TEST_CASE("retain_grad keeps the gradient of a non-leaf", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = a * 3;
  b.retain_grad();
  (b * b).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(b.grad(), tensor_of({6, 12}, {2}));
}

TEST_CASE("create_graph makes the gradient differentiable", "[autograd]") {
  Tensor x = leaf({3}, {1});
  Tensor y = x * x * x;  // y' = 3x^2 = 27, y'' = 6x = 18
  y.backward(ones({1}, {.dtype = DType::f64}), false, /*create_graph=*/true);
  Tensor g = x.grad();
  KILN_CHECK_EQUAL(g, tensor_of({27}, {1}));
  CHECK(g.requires_grad());
  x.set_grad({});
  g.backward(ones({1}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({18}, {1}));
}

TEST_CASE("requires_grad_ applies to floating leaves only", "[autograd]") {
  CHECK_THROWS_WITH(arange(3).requires_grad_(), Catch::Contains("floating"));
  Tensor a = leaf({1}, {1});
  CHECK_THROWS_WITH((a * 2).requires_grad_(false), Catch::Contains("leaf"));
  CHECK_FALSE((a > 0).requires_grad());  // bool outputs carry no gradient
}

TEST_CASE("gradcheck passes on correct formulas and reports a wrong one", "[autograd]") {
  Tensor a = randn({3, 4}, {.dtype = DType::f64}).requires_grad_();
  Tensor b = randn({4}, {.dtype = DType::f64}).requires_grad_();
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[1] - in[0]; }, {a, b}));
  // A hook that corrupts the gradient must be caught.
  Tensor c = randn({2}, {.dtype = DType::f64}).requires_grad_();
  c.register_hook([](const Tensor& g) { return g * 1.5; });
  CHECK_THROWS_WITH(gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0]; }, {c}),
                    Catch::Contains("finite differences"));
}

TEST_CASE("double backward through formulas that read their saved output", "[autograd]") {
  // d/dx exp(x) = exp(x): its formula reads the output, which is saved without its graph;
  // a create_graph backward reattaches it, so the second derivative is exp(x) too.
  Tensor x = tensor_of({0.5, -1.0}, {2}, DType::f64).requires_grad_();
  Tensor y = exp(x);
  y.backward(ones({2}, {.dtype = DType::f64}), false, true);
  Tensor g = x.grad();
  REQUIRE(g.requires_grad());
  x.set_grad({});
  g.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_CLOSE(x.grad(), exp(x.detach()), 1e-12, 0);
  // tanh'' = -2 tanh (1 - tanh^2)
  Tensor z = tensor_of({0.3}, {1}, DType::f64).requires_grad_();
  tanh(z).backward(ones({1}, {.dtype = DType::f64}), false, true);
  Tensor gz = z.grad();
  z.set_grad({});
  gz.backward(ones({1}, {.dtype = DType::f64}));
  const double t = std::tanh(0.3);
  KILN_CHECK_CLOSE(z.grad(), tensor_of({-2 * t * (1 - t * t)}, {1}, DType::f64), 1e-12, 0);
}
