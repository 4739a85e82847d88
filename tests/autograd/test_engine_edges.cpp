// Engine behaviour found wanting in review; each case once gave a wrong gradient or a crash.
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
Tensor leaf(std::vector<double> v) {
  Tensor t = tensor_of(v, {static_cast<int64_t>(v.size())}, DType::f64);
  t.requires_grad_();
  return t;
}
Tensor ones2() { return ones({2}, {.dtype = DType::f64}); }
}  // namespace

TEST_CASE("in-place writes through views of tensors that require grad are refused", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2;
  CHECK_THROWS_WITH(y.narrow(0, 0, 1).mul_(3), Catch::Contains("view"));
  CHECK_THROWS_WITH(x.narrow(0, 0, 1).mul_(3), Catch::Contains("view"));
  Tensor plain = zeros({2}, {.dtype = DType::f64});
  CHECK_THROWS_WITH(plain.narrow(0, 0, 1).copy_(x.narrow(0, 0, 1) * 1), Catch::Contains("view"));
  NoGradGuard no_grad;
  y.narrow(0, 0, 1).mul_(3);  // fine without recording
  CHECK(y[0].item<double>() == 6.0);
}

TEST_CASE("copy_ from a source without grad cuts the target's history", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2;
  y.copy_(zeros({2}, {.dtype = DType::f64}));
  (y * x).backward(ones2());
  KILN_CHECK_EQUAL(x.grad(), tensor_of({0, 0}, {2}));  // only through the second factor, y = 0
}

TEST_CASE("create_graph gradients are owned copies", "[autograd]") {
  Tensor a = leaf({1, 1, 1}), b = leaf({1, 1, 1}), c = leaf({2, 2, 2});
  sum((a + b) * c).backward({}, false, true);
  CHECK(a.grad().storage() != b.grad().storage());
  a.set_grad({});
  b.set_grad({});
  sum(a).backward({}, false, true);
  sum(a).backward();  // adds into a gradient that came from an expand
  KILN_CHECK_EQUAL(a.grad(), tensor_of({2, 2, 2}, {3}));
}

TEST_CASE("a hook may remove itself while it runs", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = x * 3;
  int handle = 0, calls = 0;
  handle = y.register_hook([&](const Tensor&) {
    ++calls;
    y.remove_hook(handle);
    return Tensor();
  });
  int leaf_handle = 0;
  leaf_handle = x.register_hook([&](const Tensor&) {
    x.remove_hook(leaf_handle);
    return Tensor();
  });
  y.backward(ones2(), true);
  y.backward(ones2());
  CHECK(calls == 1);
  KILN_CHECK_EQUAL(x.grad(), tensor_of({6, 6}, {2}));
}

TEST_CASE("a second backward through nodes that saved nothing accumulates", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = x + 1;
  sum(y).backward();
  sum(y).backward();
  KILN_CHECK_EQUAL(x.grad(), tensor_of({2, 2}, {2}));
  Tensor z = x * x;  // saves x: the second pass must say the graph was freed
  sum(z).backward();
  CHECK_THROWS_WITH(sum(z).backward(), Catch::Contains("retain_graph"));
}

TEST_CASE("unread inputs are not saved: changing them before backward is fine", "[autograd]") {
  Tensor x = leaf({1, -1});
  Tensor h = x * 1;
  Tensor y = where(x.detach() > 0, h, 0.0);
  h.add_(1);
  y.backward(ones2());
  KILN_CHECK_EQUAL(x.grad(), tensor_of({1, 0}, {2}));
}

TEST_CASE("the backward gradient is cast to the output dtype and checked", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2;
  y.backward(ones({2}));  // f32 gradient for an f64 output
  KILN_CHECK_EQUAL(x.grad(), tensor_of({2, 2}, {2}));
  CHECK_THROWS_WITH((x * 2).backward(ones({3}, {.dtype = DType::f64})), Catch::Contains("backward"));
}

TEST_CASE("a gradient nothing else holds becomes the leaf's grad without a copy", "[autograd]") {
  // A Linear's weight: matmul(x, w.t()). Its gradient is computed in w's layout, so it
  // comes out contiguous and AccumulateGrad keeps that very buffer (the hook sees it).
  Tensor x = random_leaf({3, 4}, 1), w = random_leaf({5, 4}, 2);
  const void* seen = nullptr;
  w.register_hook([&](const Tensor& g) {
    seen = g.data_ptr();
    return Tensor();
  });
  Tensor y = matmul(x, w.t());
  sum(y * y).backward();
  CHECK(w.grad().is_contiguous());
  CHECK(w.grad().data_ptr() == seen);
  // Reference: d/dw sum((x w^T)^2) = 2 (x w^T)^T x.
  NoGradGuard no_grad;
  KILN_CHECK_CLOSE(w.grad(), mm((mm(x, w.t()) * 2).t().contiguous(), x), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(x.grad(), mm(mm(x, w.t()) * 2, w), 1e-12, 1e-12);
}

TEST_CASE("a gradient that is shared or kept elsewhere is copied", "[autograd]") {
  // The same gradient flows to both leaves of a + b: each gets its own memory.
  Tensor a = leaf({1, 1, 1}), b = leaf({1, 1, 1});
  sum((a + b) * 2).backward();
  CHECK(a.grad().storage() != b.grad().storage());
  a.grad().add_(1);
  KILN_CHECK_EQUAL(b.grad(), tensor_of({2, 2, 2}, {3}));
  // A hook that keeps the gradient: the leaf's grad must not alias it.
  Tensor c = leaf({1, 2}), kept;
  c.register_hook([&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  sum(c * 3).backward();
  REQUIRE(kept.defined());
  CHECK(kept.storage() != c.grad().storage());
  // A gradient that is a view (sum's backward expands a scalar) is copied into memory of
  // the leaf's own size.
  Tensor d = leaf({1, 2, 3});
  sum(d).backward();
  CHECK(d.grad().is_contiguous());
  CHECK(d.grad().storage()->nbytes == 3 * sizeof(double));
}
