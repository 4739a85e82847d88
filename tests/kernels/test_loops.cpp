// The strided elementwise iterator (kernels/cpu/loops.h) against a naive index loop, on
// random shapes, permutations, steps and broadcasts, with outputs of any layout.
#include <random>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A random view of fresh data with `shape`: permuted, stepped, or both.
Tensor random_layout(const Shape& shape, std::mt19937& rng) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<int64_t> perm(nd);
  for (int64_t i = 0; i < nd; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  Shape permuted(nd);
  for (int64_t i = 0; i < nd; ++i) permuted[perm[i]] = shape[i];
  const int64_t step = 1 + static_cast<int64_t>(rng() % 2);
  Shape big = permuted;
  if (nd > 0) big.back() *= step;
  Tensor base = randn(big, {.dtype = DType::f64});
  Tensor v = nd > 0 ? base.slice(-1, 0, big.back(), step) : base;
  std::vector<int64_t> inverse(nd);
  for (int64_t i = 0; i < nd; ++i) inverse[i] = perm[i];
  return v.permute(inverse);
}

Shape random_shape(std::mt19937& rng) {
  Shape s(rng() % 5);
  for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % 4);
  return s;
}

// `shape` with some dims set to 1 or dropped from the front: broadcastable to it.
Shape broadcastable(const Shape& shape, std::mt19937& rng) {
  Shape s = shape;
  for (auto& d : s)
    if (rng() % 3 == 0) d = 1;
  const size_t drop = s.empty() ? 0 : rng() % (s.size() + 1);
  return Shape(s.begin() + static_cast<int64_t>(drop), s.end());
}

}  // namespace

TEST_CASE("elementwise loops match a naive loop on random layouts", "[loops]") {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const Shape shape = random_shape(rng);
    Tensor a = random_layout(shape, rng);
    Tensor b = random_layout(broadcastable(shape, rng), rng);
    Tensor out = random_layout(shape, rng);  // an in-place target of any layout
    out.copy_(a);
    out.mul_(b);
    Tensor fresh = a * b;
    Tensor expected = zeros(shape, {.dtype = DType::f64});
    const Shape& bs = b.shape();
    for_each_index(shape, [&](const std::vector<int64_t>& i) {
      std::vector<int64_t> j(bs.size());
      for (size_t d = 0; d < bs.size(); ++d) {
        const size_t sd = shape.size() - bs.size() + d;
        j[d] = bs[d] == 1 ? 0 : i[sd];
      }
      const double v = at(a, i) * at(b, j);
      int64_t off = 0;
      for (size_t d = 0; d < i.size(); ++d) off += i[d] * expected.strides()[d];
      expected.data_ptr<double>()[off] = v;
    });
    INFO("shape " << shape_str(shape) << " b " << shape_str(bs) << " strides a "
                  << shape_str(a.strides()) << " out " << shape_str(out.strides()));
    KILN_CHECK_EQUAL(out, expected);
    KILN_CHECK_EQUAL(fresh, expected);
  }
}

TEST_CASE("elementwise loops split large tensors across threads correctly", "[loops]") {
  // 3 * 5 * 70001 elements: ranges start mid-row, so the carry logic is exercised.
  Tensor a = arange(3 * 5 * 70001, {.dtype = DType::f64}).reshape({3, 5, 70001});
  Tensor b = arange(5, {.dtype = DType::f64}).reshape({5, 1});
  Tensor c = (a + b).permute({2, 0, 1}).contiguous().permute({1, 2, 0});
  Tensor d = c * 2;
  const std::vector<double> got = values(d);
  size_t k = 0;
  bool ok = true;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t l = 0; l < 70001; ++l, ++k)
        ok = ok && got[k] == 2.0 * static_cast<double>(i * 5 * 70001 + j * 70001 + l + j);
  CHECK(ok);
}
