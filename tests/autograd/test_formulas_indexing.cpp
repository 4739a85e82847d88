// Backward formulas of the indexing, joining and dropout ops, checked with gradcheck in
// f64 (eps 1e-6, atol 1e-5, rtol 1e-3: gradcheck's defaults) on small shapes. Index
// inputs are integer tensors that need no gradient.
#include "autograd/gradcheck.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor index_of(std::vector<double> v, Shape shape, DType dtype = DType::i64) {
  return tensor_of(v, std::move(shape), dtype);
}

void check_grad(const Fn& fn, const std::vector<Tensor>& inputs) {
  CHECK_NOTHROW(gradcheck(fn, inputs));
}

}  // namespace

TEST_CASE("cat and stack gradients are the pieces of the output gradient", "[formulas-tensor]") {
  check_grad(
      [](const auto& in) {
        return cat({in[0], in[1], in[2]}, 1);
      },
      {random_leaf({2, 1}), random_strided_leaf({2, 3}), random_leaf({2, 2}, 3)});
  check_grad(
      [](const auto& in) {
        return cat({in[0], in[1]}, -2);
      },
      {random_leaf({1, 3}), random_leaf({2, 3}, 4)});
  // A 1-d empty tensor takes no part in cat.
  check_grad(
      [](const auto& in) {
        return cat({in[0], in[1], in[2]}, 0);
      },
      {random_leaf({2, 2}), random_leaf({0}), random_leaf({1, 2}, 5)});
  // An input that needs no gradient still shifts the others' pieces.
  check_grad(
      [](const auto& in) {
        return cat({in[0], in[1]}, 0);
      },
      {ones({2}, {.dtype = DType::f64}), random_leaf({3})});
  check_grad(
      [](const auto& in) {
        return stack({in[0], in[1]}, 0);
      },
      {random_leaf({2, 3}), random_strided_leaf({2, 3})});
  check_grad(
      [](const auto& in) {
        return stack({in[0], in[1], in[2]}, -1);
      },
      {random_leaf({2}), random_leaf({2}, 3), random_leaf({2}, 4)});
}

TEST_CASE("pad gradients crop padding and zero-fill cropped parts", "[formulas-tensor]") {
  check_grad([](const auto& in) { return pad(in[0], {1, 2}); }, {random_leaf({2, 3})});
  check_grad([](const auto& in) { return pad(in[0], {0, 1, 2, 0}, 1.5); }, {random_strided_leaf({2, 3})});
  check_grad([](const auto& in) { return pad(in[0], {-1, 2, 1, -1}); }, {random_leaf({3, 4})});
}

TEST_CASE("gather and scatter_add gradients", "[formulas-tensor]") {
  const Tensor index = index_of({0, 2, 2, 1, 0, 0}, {2, 3});
  check_grad([&](const auto& in) { return gather(in[0], 1, index); }, {random_leaf({2, 4})});
  check_grad(
      [&](const auto& in) {
        return gather(in[0], 0, index_of({1, 0, 1}, {1, 3}));
      },
      {random_strided_leaf({2, 4})});
  check_grad([&](const auto& in) { return gather(in[0], -1, index); }, {random_leaf({3, 3})});
  // src larger than the index: its unreached elements get zero.
  check_grad([&](const auto& in) { return scatter_add(in[0], 1, index, in[1]); },
             {random_leaf({2, 3}), random_leaf({3, 4}, 3)});
  check_grad(
      [&](const auto& in) {
        return scatter_add(in[0], 0, index_of({1, 0, 1, 1}, {2, 2}), in[1]);
      },
      {random_strided_leaf({2, 2}), random_leaf({2, 2}, 3)});
  Tensor src = random_leaf({2, 3});
  scatter_add(zeros({2, 3}, {.dtype = DType::f64}), 1, index.slice(1, 0, 2), src)
      .backward(ones({2, 3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(src.grad(), tensor_of({1, 1, 0, 1, 1, 0}, {2, 3}));
}

TEST_CASE("index_select gradients accumulate repeated indices", "[formulas-tensor]") {
  for (DType dtype : {DType::i64, DType::i32}) {
    const Tensor index = index_of({2, 0, 2}, {3}, dtype);
    check_grad([&](const auto& in) { return index_select(in[0], 0, index); }, {random_leaf({3, 2})});
    check_grad([&](const auto& in) { return index_select(in[0], -1, index); },
               {random_strided_leaf({2, 3})});
  }
  check_grad([](const auto& in) { return index_select(in[0], 1, index_of({1}, {})); },
             {random_leaf({2, 3})});
  Tensor x = random_leaf({3});
  index_select(x, 0, index_of({2, 0, 2}, {3})).backward(ones({3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), tensor_of({1, 0, 2}, {3}));
}

TEST_CASE("embedding gradients skip the padding row", "[formulas-tensor]") {
  const Tensor indices = index_of({1, 3, 1, 0, 3, 3}, {2, 3});
  check_grad([&](const auto& in) { return embedding(in[0], indices); }, {random_leaf({4, 2})});
  check_grad([&](const auto& in) { return embedding(in[0], indices.to(DType::i32)); },
             {random_leaf({4, 2})});
  // padding_idx only changes the gradient, so it is checked against exact values.
  Tensor w = random_leaf({4, 2});
  embedding(w, indices, -1).backward(ones({2, 3, 2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(w.grad(), tensor_of({1, 1, 2, 2, 0, 0, 0, 0}, {4, 2}));
  // embedding_backward is itself differentiable in its gradient input.
  check_grad([&](const auto& in) { return embedding_backward(in[0], indices, 4); },
             {random_leaf({2, 3, 2})});
  check_grad([&](const auto& in) { return embedding_backward(in[0], indices, 4, 1); },
             {random_leaf({2, 3, 2})});
}

TEST_CASE("flip tril triu and cumsum gradients", "[formulas-tensor]") {
  check_grad([](const auto& in) { return flip(in[0], {0, -1}); }, {random_strided_leaf({2, 3})});
  for (int64_t diagonal : {-1, 0, 1}) {
    check_grad([&](const auto& in) { return tril(in[0], diagonal); }, {random_leaf({2, 3, 3})});
    check_grad([&](const auto& in) { return triu(in[0], diagonal); }, {random_strided_leaf({3, 4})});
  }
  for (int64_t dim : {0, 1, -1}) {
    check_grad([&](const auto& in) { return cumsum(in[0], dim); }, {random_leaf({3, 4})});
    check_grad([&](const auto& in) { return cumsum(in[0], dim); }, {random_strided_leaf({3, 4})});
  }
  check_grad([](const auto& in) { return cumsum(in[0], 0); }, {random_leaf({})});
}

TEST_CASE("topk and sort gradients go back to where the values came from", "[formulas-tensor]") {
  for (bool largest : {true, false}) {
    check_grad([&](const auto& in) { return topk(in[0], 2, -1, largest).first; }, {random_leaf({3, 4})});
    check_grad([&](const auto& in) { return topk(in[0], 2, 0, largest).first; },
               {random_strided_leaf({3, 4})});
    check_grad([&](const auto& in) { return sort(in[0], 1, largest).first; }, {random_leaf({2, 4})});
    check_grad([&](const auto& in) { return sort(in[0], 0, largest).first; },
               {random_strided_leaf({3, 2})});
  }
  auto [values, indices] = topk(random_leaf({4}), 2);
  CHECK(values.requires_grad());
  CHECK_FALSE(indices.requires_grad());
}

TEST_CASE("dropout gradients are the mask times the scale", "[formulas-tensor]") {
  Generator gen(3);
  Tensor x = random_leaf({4, 5});
  auto [y, mask] = dropout_with_mask(x, 0.5, true, &gen);
  y.backward(ones({4, 5}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(x.grad(), mask.to(DType::f64) * 2.0);
  Tensor z = random_leaf({3});
  dropout(z, 1.0, true, &gen).backward(ones({3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(z.grad(), zeros({3}));
}

TEST_CASE("gather and scatter gradients are differentiable under create_graph",
          "[formulas-tensor]") {
  Tensor x = random_leaf({3});
  Tensor y = gather(x, 0, index_of({2, 2, 0}, {3}));  // x2, x2, x0
  sum(y * y).backward({}, false, /*create_graph=*/true);
  Tensor gx = x.grad();  // [2 x0, 0, 4 x2]
  x.set_grad({});
  sum(gx * gx).backward();  // d/dx of 4 x0^2 + 16 x2^2
  const std::vector<double> v = values(x.detach());
  KILN_CHECK_CLOSE(x.grad(), tensor_of({8 * v[0], 0, 32 * v[2]}, {3}, DType::f64), 1e-12, 1e-12);
}
