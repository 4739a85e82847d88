// Backward formulas of the reductions, checked with gradcheck in f64 (eps 1e-6, atol
// 1e-5, rtol 1e-3: gradcheck's defaults) over every dims / keepdim variant on small shapes;
// ties and zeros are checked against exact values.
#include "autograd/gradcheck.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor leaf_of(std::vector<double> v, Shape shape) {
  Tensor t = tensor_of(v, shape, DType::f64);
  t.requires_grad_();
  return t;
}

// Every dims list tried: all, one dim, a negative dim, two dims, and a repeat of the last
// dim through its negative form.
const std::vector<DimList> kDimLists = {{}, {0}, {-1}, {0, 2}, {1, -1}};

// gradcheck of reduce(x, dims, keepdim) for every dims list and keepdim, on a contiguous
// and a strided [2, 3, 4] input, and on a 0-d input reduced over everything.
void check_all_variants(const std::function<Tensor(const Tensor&, const DimList&, bool)>& reduce) {
  for (const DimList& dims : kDimLists) {
    for (bool keepdim : {false, true}) {
      INFO("dims " << shape_str(dims) << " keepdim " << keepdim);
      Fn fn = [&](const std::vector<Tensor>& in) { return reduce(in[0], dims, keepdim); };
      CHECK_NOTHROW(gradcheck(fn, {random_leaf({2, 3, 4})}));
      CHECK_NOTHROW(gradcheck(fn, {random_strided_leaf({2, 3, 4})}));
    }
  }
  for (bool keepdim : {false, true}) {
    Fn fn = [&](const std::vector<Tensor>& in) { return reduce(in[0], {}, keepdim); };
    CHECK_NOTHROW(gradcheck(fn, {random_leaf({})}));
  }
}

}  // namespace

TEST_CASE("sum and mean gradients over every dims variant", "[formulas-tensor]") {
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return sum(x, d, k); });
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return mean(x, d, k); });
}

TEST_CASE("sum to another dtype gives a gradient of the input dtype", "[formulas-tensor]") {
  Tensor x = ones({2, 2});
  x.requires_grad_();
  sum(x, {0}, false, DType::f64).backward(ones({2}, {.dtype = DType::f64}));
  CHECK(x.grad().dtype() == DType::f32);
  KILN_CHECK_EQUAL(x.grad(), ones({2, 2}));
}

TEST_CASE("prod gradients with and without zeros", "[formulas-tensor]") {
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return prod(x, d, k); });
  // Rows with no zero, one zero and two zeros; prod is multilinear, so finite differences
  // are exact there too.
  Tensor x = leaf_of({1, 2, 3, 0, 2, 3, 0, 0, 3}, {3, 3});
  CHECK_NOTHROW(gradcheck([](const auto& in) { return prod(in[0], {1}); }, {x}));
  CHECK_NOTHROW(gradcheck([](const auto& in) { return prod(in[0], {0}, true); }, {x}));
  CHECK_NOTHROW(gradcheck([](const auto& in) { return prod(in[0]); }, {x}));
  prod(x, {1}).backward(ones({3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({6, 3, 2, 6, 0, 0, 0, 0, 0}, {3, 3}));
}

TEST_CASE("amax and amin gradients over every dims variant", "[formulas-tensor]") {
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return amax(x, d, k); });
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return amin(x, d, k); });
}

TEST_CASE("amax and max without a dim split the gradient evenly among ties", "[formulas-tensor]") {
  Tensor x = leaf_of({1, 3, 3, 2, 3, 0}, {2, 3});
  amax(x).backward();
  KILN_CHECK_CLOSE(x.grad(), tensor_of({0, 1. / 3, 1. / 3, 0, 1. / 3, 0}, {2, 3}, DType::f64),
                   1e-15, 0);
  x.set_grad({});
  amin(x, {1}).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({1, 0, 0, 0, 0, 1}, {2, 3}));
  x.set_grad({});
  max(x).backward();
  KILN_CHECK_CLOSE(x.grad(), tensor_of({0, 1. / 3, 1. / 3, 0, 1. / 3, 0}, {2, 3}, DType::f64),
                   1e-15, 0);
  x.set_grad({});
  min(x).backward();
  KILN_CHECK_EQUAL(x.grad(), tensor_of({0, 0, 0, 0, 0, 1}, {2, 3}));
}

TEST_CASE("max and min with a dim send the gradient to the index", "[formulas-tensor]") {
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      INFO("dim " << dim << " keepdim " << keepdim);
      CHECK_NOTHROW(gradcheck([&](const auto& in) { return max(in[0], dim, keepdim).values; },
                              {random_leaf({2, 3, 4})}));
      CHECK_NOTHROW(gradcheck([&](const auto& in) { return min(in[0], dim, keepdim).values; },
                              {random_strided_leaf({2, 3, 4})}));
    }
  }
  CHECK_NOTHROW(gradcheck([](const auto& in) { return max(in[0], 0).values; }, {random_leaf({})}));
  // Ties: the first index takes all of it; the indices output needs no gradient.
  Tensor x = leaf_of({2, 2, 1, 5}, {2, 2});
  ValuesIndices m = max(x, 1);
  CHECK_FALSE(m.indices.requires_grad());
  m.values.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({1, 0, 0, 1}, {2, 2}));
}

TEST_CASE("var and std gradients for each correction", "[formulas-tensor]") {
  for (double correction : {0.0, 1.0, 2.0}) {
    INFO("correction " << correction);
    for (const DimList& dims : kDimLists) {
      for (bool keepdim : {false, true}) {
        INFO("dims " << shape_str(dims) << " keepdim " << keepdim);
        CHECK_NOTHROW(
            gradcheck([&](const auto& in) { return var(in[0], dims, correction, keepdim); },
                      {random_leaf({3, 3, 4})}));
        CHECK_NOTHROW(
            gradcheck([&](const auto& in) { return kiln::std(in[0], dims, correction, keepdim); },
                      {random_strided_leaf({3, 3, 4})}));
      }
    }
  }
  // A constant slice has zero std; its gradient is zero rather than NaN.
  Tensor c = leaf_of({1, 1, 1}, {3});
  kiln::std(c).backward();
  KILN_CHECK_EQUAL(c.grad(), zeros({3}));
}

TEST_CASE("logsumexp gradients over every dims variant", "[formulas-tensor]") {
  check_all_variants([](const Tensor& x, const DimList& d, bool k) { return logsumexp(x, d, k); });
}

TEST_CASE("norm gradients for p of 2 1 3 0.5 and the infinities", "[formulas-tensor]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {2.0, 1.0, 3.0, 0.5, inf, -inf}) {
    INFO("p " << p);
    check_all_variants([p](const Tensor& x, const DimList& d, bool k) { return norm(x, p, d, k); });
  }
  Tensor x = leaf_of({0, 0, 3, 4}, {2, 2});
  norm(x, 2, {1}).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_CLOSE(x.grad(), tensor_of({0, 0, 0.6, 0.8}, {2, 2}, DType::f64), 1e-15, 1e-15);
  x.set_grad({});
  norm(x, 0).backward();
  KILN_CHECK_EQUAL(x.grad(), zeros({2, 2}));
  x.set_grad({});
  norm(x, 3, {1}).backward(ones({2}, {.dtype = DType::f64}));
  CHECK(values(x.grad())[0] == 0);  // no NaN from the zero norm
}

TEST_CASE("reduction gradients are differentiable under create_graph", "[formulas-tensor]") {
  // gradcheck of the first derivative (taken with create_graph) checks the second. Only
  // ops whose own formulas exist here (mul, sum, expand, scatter_add, gather) take part.
  const auto first_grad = [](const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
    EnableGradGuard enable;
    Tensor y = f(x);
    x.set_grad({});
    y.backward(ones_like(y), false, /*create_graph=*/true);
    Tensor g = x.grad();
    x.set_grad({});
    return g;
  };
  CHECK_NOTHROW(gradcheck(
      [&](const auto& in) {
        return first_grad(in[0], [](const Tensor& x) { return sum(x * x * x, {1}); });
      },
      {random_leaf({2, 3})}));
  CHECK_NOTHROW(gradcheck(
      [&](const auto& in) {
        return first_grad(in[0], [](const Tensor& x) { return max(x * x, -1, true).values; });
      },
      {random_leaf({2, 3})}));
}
