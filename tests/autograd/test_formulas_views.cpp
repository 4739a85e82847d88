// Backward formulas of the view ops, checked with gradcheck in f64 (eps 1e-6, atol 1e-5,
// rtol 1e-3: gradcheck's defaults) on small shapes, contiguous and strided inputs.
#include "autograd/gradcheck.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void check_grad(const Fn& fn, const std::vector<Tensor>& inputs) {
  CHECK_NOTHROW(gradcheck(fn, inputs));
}

}  // namespace

TEST_CASE("view and reshape gradients take the input shape", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].view({6, 4}); }, {random_leaf({2, 3, 4})});
  check_grad([](const auto& in) { return in[0].view({-1}); }, {random_leaf({2, 3})});
  check_grad([](const auto& in) { return in[0].view({2, 2, 3}); }, {random_strided_leaf({2, 6})});
  check_grad([](const auto& in) { return in[0].view({}); }, {random_leaf({1, 1})});
  check_grad([](const auto& in) { return in[0].flatten(); }, {random_leaf({2, 3})});
}

TEST_CASE("permute gradients use the inverse permutation", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].permute({2, 0, 1}); }, {random_leaf({2, 3, 4})});
  check_grad([](const auto& in) { return in[0].permute({-1, 0, -2}); }, {random_strided_leaf({2, 3, 4})});
  check_grad([](const auto& in) { return in[0].transpose(0, 1); }, {random_leaf({3, 2})});
}

TEST_CASE("slice gradients land in zeros of the input shape", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].slice(1, 1, 4); }, {random_leaf({2, 5})});
  check_grad([](const auto& in) { return in[0].slice(1, 0, 5, 2); }, {random_leaf({2, 5})});
  check_grad([](const auto& in) { return in[0].slice(-1, 1, 6, 3); }, {random_leaf({2, 7})});
  check_grad([](const auto& in) { return in[0].slice(0, -3, -1, 2); }, {random_strided_leaf({5, 2})});
  check_grad([](const auto& in) { return in[0].slice(0, 2, 100, 1); }, {random_leaf({4, 2})});
  check_grad([](const auto& in) { return in[0].slice(0, 3, 3, 1); }, {random_leaf({4, 2})});

  Tensor x = random_leaf({7});
  x.slice(0, 1, 7, 4).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({0, 1, 0, 0, 0, 1, 0}, {7}));
}

TEST_CASE("select gradients land in one slice of zeros", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].select(0, 1); }, {random_leaf({3, 2})});
  check_grad([](const auto& in) { return in[0].select(-1, -1); }, {random_strided_leaf({2, 3})});
  check_grad([](const auto& in) { return in[0][0]; }, {random_leaf({1, 2, 2})});
}

TEST_CASE("expand gradients sum over the expanded dims", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].expand({2, 3, 4}); }, {random_leaf({3, 1})});
  check_grad([](const auto& in) { return in[0].expand({2, -1}); }, {random_strided_leaf({1, 3})});
  check_grad([](const auto& in) { return in[0].expand({2, 2}); }, {random_leaf({})});
}

TEST_CASE("squeeze and unsqueeze gradients reshape back", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].squeeze(); }, {random_leaf({1, 3, 1})});
  check_grad([](const auto& in) { return in[0].squeeze(-1); }, {random_leaf({2, 1})});
  check_grad([](const auto& in) { return in[0].unsqueeze(-1); }, {random_strided_leaf({2, 3})});
  check_grad([](const auto& in) { return in[0].unsqueeze(0); }, {random_leaf({})});
}

TEST_CASE("as_strided gradients flow through storage positions", "[formulas-tensor]") {
  check_grad([](const auto& in) { return in[0].as_strided({2, 2}, {1, 2}, 1); }, {random_leaf({6})});
  // Overlapping output windows accumulate.
  check_grad([](const auto& in) { return in[0].as_strided({3, 2}, {1, 1}, 0); }, {random_leaf({4})});
  // A strided leaf: storage positions 0, 2, 4 are its first row.
  check_grad([](const auto& in) { return in[0].as_strided({3}, {2}, 0); }, {random_strided_leaf({2, 3})});

  Tensor x = random_leaf({3});
  Tensor y = x.expand({2, 3}).as_strided({2}, {1}, 0);
  CHECK_THROWS_WITH(y.backward(ones({2}, {.dtype = DType::f64})),
                    Catch::Contains("as_strided") && Catch::Contains("overlap"));
}

TEST_CASE("view gradients are differentiable under create_graph", "[formulas-tensor]") {
  Tensor x = random_leaf({5});
  Tensor y = x.slice(0, 1, 5, 2);  // x1, x3
  sum(y * y * x.select(0, 0)).backward({}, false, /*create_graph=*/true);
  Tensor gx = x.grad();
  REQUIRE(gx.requires_grad());
  // gx = [x1^2 + x3^2, 2 x0 x1, 0, 2 x0 x3, 0]; d sum(gx) / dx = [2x1 + 2x3, 2x1 + 2x0, 0, 2x3 +
  // 2x0, 0].
  x.set_grad({});
  sum(gx).backward();
  const std::vector<double> v = values(x.detach());
  KILN_CHECK_CLOSE(x.grad(),
                   tensor_of({2 * v[1] + 2 * v[3], 2 * v[1] + 2 * v[0], 0, 2 * v[3] + 2 * v[0], 0},
                             {5}, DType::f64),
                   1e-12, 1e-12);
}
