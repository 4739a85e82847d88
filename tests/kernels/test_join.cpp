// cat, stack, split, chunk and pad against naive references. Values are small integers, so
// every dtype holds them exactly and results compare with zero tolerance.
#include "core/ops/join.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Naive cat: walks the output and finds which input each element comes from.
Tensor reference_cat(const std::vector<Tensor>& ts, int64_t dim, DType dtype) {
  Shape shape = ts[0].shape();
  shape[dim] = 0;
  for (const Tensor& t : ts) shape[dim] += t.size(dim);
  std::vector<double> v;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> i = idx;
    size_t k = 0;
    while (i[dim] >= ts[k].size(dim)) i[dim] -= ts[k++].size(dim);
    v.push_back(at(ts[k], i));
  });
  return tensor_of(v, shape, dtype);
}

}  // namespace

TEST_CASE("cat matches a naive copy for every dtype and layout", "[index][join]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor a = small_integers({2, 3, 4}, dtype), b = small_integers({2, 2, 4}, dtype, 5);
  KILN_CHECK_EQUAL(cat({a, b}, 1), reference_cat({a, b}, 1, dtype));
  CHECK(cat({a, b}, 1).dtype() == dtype);
  KILN_CHECK_EQUAL(cat({strided_copy(a), transposed_copy(b)}, -2), reference_cat({a, b}, 1, dtype));
  const Tensor c = small_integers({1, 3, 4}, dtype, 2);
  KILN_CHECK_EQUAL(cat({a, c, a}, 0), reference_cat({a, c, a}, 0, dtype));
  const Tensor d = small_integers({2, 3, 1}, dtype, 9);
  KILN_CHECK_EQUAL(cat({transposed_copy(a), d}, 2), reference_cat({a, d}, 2, dtype));
}

TEST_CASE("cat promotes dtypes and skips 1-d empty tensors", "[index][join]") {
  const Tensor i = small_integers({2, 2}, DType::i32), f = small_integers({2, 1}, DType::f32);
  CHECK(cat({i, f}, 1).dtype() == DType::f32);
  KILN_CHECK_EQUAL(cat({i, f}, 1), reference_cat({i, f}, 1, DType::f32));
  CHECK(cat({small_integers({2}, DType::boolean), small_integers({3}, DType::i64)}).dtype() == DType::i64);
  CHECK(cat({small_integers({2}, DType::f16), small_integers({3}, DType::bf16)}).dtype() == DType::f32);
  CHECK(cat({small_integers({2}, DType::u8), small_integers({3}, DType::i32)}).dtype() == DType::i32);

  const Tensor empty = zeros({0}, {.dtype = DType::f64});
  const Tensor m = small_integers({2, 3}, DType::f32);
  const Tensor r = cat({empty, m, empty}, 1);
  KILN_CHECK_EQUAL(r, m);
  CHECK(r.dtype() == DType::f64);  // the skipped tensor still takes part in promotion
  CHECK(cat({empty, empty}).shape() == Shape{0});
  // An empty tensor of more dims is not skipped: its other sizes must fit.
  CHECK(cat({zeros({0, 3}), m}, 0).shape() == Shape{2, 3});
}

TEST_CASE("cat rejects bad input and shows every shape", "[index][join]") {
  const Tensor a = zeros({2, 3}), b = zeros({3, 3}), c = zeros({2, 3, 1});
  CHECK_THROWS_WITH(cat({a, b}, 1), Catch::Contains("cat") && Catch::Contains("f32[2,3] cpu") &&
                                        Catch::Contains("f32[3,3] cpu"));
  CHECK_THROWS_WITH(cat({a, c}, 0), Catch::Contains("cat") && Catch::Contains("[2,3,1]"));
  CHECK_THROWS_WITH(cat({a, zeros({})}, 0), Catch::Contains("cat") && Catch::Contains("0-d"));
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("cat"));
  CHECK_THROWS_WITH(cat({a, a}, 2), Catch::Contains("cat") && Catch::Contains("dim 2"));
}

TEST_CASE("stack inserts a new dim", "[index][join]") {
  const DType dtype = GENERATE(DType::f32, DType::f16, DType::i64, DType::u8, DType::boolean);
  CAPTURE(dtype);
  const Tensor a = small_integers({2, 3}, dtype), b = small_integers({2, 3}, dtype, 4),
               c = small_integers({2, 3}, dtype, 8);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    CAPTURE(dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const Tensor expected =
        reference_cat({a.unsqueeze(d), b.unsqueeze(d), c.unsqueeze(d)}, d, dtype);
    KILN_CHECK_EQUAL(stack({a, strided_copy(b), transposed_copy(c)}, dim), expected);
  }
  CHECK(stack({zeros({}), ones({})}).shape() == Shape{2});
  CHECK(stack({small_integers({2}, DType::i32), small_integers({2}, DType::f64)}).dtype() == DType::f64);
}

TEST_CASE("stack rejects bad input", "[index][join]") {
  CHECK_THROWS_WITH(stack({zeros({2, 3}), zeros({3, 2})}), Catch::Contains("stack") &&
                                                               Catch::Contains("[2,3]") &&
                                                               Catch::Contains("[3,2]"));
  CHECK_THROWS_WITH(stack({zeros({2}), zeros({2})}, 3), Catch::Contains("stack"));
  CHECK_THROWS_WITH(stack({}), Catch::Contains("stack"));
}

TEST_CASE("split and chunk return views of consecutive pieces", "[index][join]") {
  const Tensor x = small_integers({7, 4}, DType::f32);
  std::vector<Tensor> parts = split(x, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{3, 4});
  CHECK(parts[2].shape() == Shape{1, 4});
  for (const Tensor& p : parts) CHECK(p.storage() == x.storage());
  KILN_CHECK_EQUAL(cat(parts), x);
  KILN_CHECK_EQUAL(parts[1], x.narrow(0, 3, 3));

  parts = split(x, std::vector<int64_t>{1, 0, 3}, -1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[1].shape() == Shape{7, 0});
  KILN_CHECK_EQUAL(parts[2], x.narrow(1, 1, 3));

  parts = split(transposed_copy(x), 2, 1);  // a view of a transposed tensor
  REQUIRE(parts.size() == 2);
  KILN_CHECK_EQUAL(parts[1], x.narrow(1, 2, 2));

  // torch.chunk: pieces of ceil(size / chunks), so fewer pieces when they run out.
  CHECK(chunk(x, 3).size() == 3);
  CHECK(chunk(x, 3)[2].shape() == Shape{1, 4});
  CHECK(chunk(small_integers({6}, DType::f32), 4).size() == 3);
  CHECK(chunk(x, 10).size() == 7);
  KILN_CHECK_EQUAL(cat(chunk(x, 2, 1), 1), x);
  // An empty dim: split gives one empty piece, chunk gives `chunks` of them.
  CHECK(split(zeros({0, 2}), 2).size() == 1);
  CHECK(chunk(zeros({0, 2}), 3).size() == 3);
}

TEST_CASE("split and chunk reject bad input", "[index][join]") {
  const Tensor x = zeros({4, 2});
  CHECK_THROWS_WITH(split(x, std::vector<int64_t>{1, 2}),
                    Catch::Contains("split") && Catch::Contains("[1,2]"));
  CHECK_THROWS_WITH(split(x, std::vector<int64_t>{5, -1}), Catch::Contains("split"));
  CHECK_THROWS_WITH(split(x, 0), Catch::Contains("split"));
  CHECK_THROWS_WITH(split(zeros({}), 1), Catch::Contains("split"));
  CHECK_THROWS_WITH(chunk(x, 0), Catch::Contains("chunk"));
  CHECK_THROWS_WITH(chunk(x, 2, 2), Catch::Contains("chunk") && Catch::Contains("dim 2"));
}

namespace {

// Naive constant padding of the last pads.size() / 2 dims.
Tensor reference_pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  Shape shape = x.shape();
  const int64_t nd = x.dim();
  for (size_t i = 0; i < pads.size() / 2; ++i) shape[nd - 1 - i] += pads[2 * i] + pads[2 * i + 1];
  std::vector<double> v;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> src = idx;
    bool inside = true;
    for (size_t i = 0; i < pads.size() / 2; ++i) {
      const int64_t d = nd - 1 - static_cast<int64_t>(i);
      src[d] -= pads[2 * i];
      inside = inside && src[d] >= 0 && src[d] < x.size(d);
    }
    v.push_back(inside ? at(x, src) : value);
  });
  return tensor_of(v, shape, x.dtype());
}

}  // namespace

TEST_CASE("pad matches a naive reference / negative pads crop", "[index][join]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({2, 3, 4}, dtype);
  const double value = dtype == DType::boolean ? 1.0 : 9.0;
  const std::vector<std::vector<int64_t>> cases = {
      {1, 2}, {0, 0, 2, 1}, {-1, 2, 1, -2}, {-2, -2}, {1, 1, 1, 1, 1, 1}, {2, -1, -3, 0, 0, 1},
      {-4, 1}};
  for (const auto& pads : cases) {
    CAPTURE(pads);
    const Tensor expected = reference_pad(x, pads, value);
    KILN_CHECK_EQUAL(pad(x, pads, value), expected);
    KILN_CHECK_EQUAL(pad(strided_copy(x), pads, value), expected);
    KILN_CHECK_EQUAL(pad(transposed_copy(x), pads, value), expected);
    CHECK(pad(x, pads, value).dtype() == dtype);
  }
  KILN_CHECK_EQUAL(pad(x, {}), x);
  KILN_CHECK_EQUAL(pad(x, {1, 0}), reference_pad(x, {1, 0}, 0.0));
}

TEST_CASE("pad rejects bad input", "[index][join]") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(pad(x, {1}), Catch::Contains("pad") && Catch::Contains("even"));
  CHECK_THROWS_WITH(pad(x, {1, 1, 1, 1, 1, 1}),
                    Catch::Contains("pad") && Catch::Contains("f32[2,3] cpu"));
  CHECK_THROWS_WITH(pad(x, {-2, -2}), Catch::Contains("pad") && Catch::Contains("negative"));
}
