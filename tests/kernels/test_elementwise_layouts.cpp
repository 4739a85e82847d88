// Randomized layouts for the elementwise loops: operands and outputs that are permuted,
// gapped, offset or broadcast in random dims, against a naive double reference. Values are
// small integers, so every result is exact in f32 and the comparison is exact.
#include <algorithm>
#include <numeric>
#include <random>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Rng = std::mt19937;
int pick(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// The same values as `t` in a random memory layout.
Tensor random_layout(const Tensor& t, Rng& rng) {
  if (t.dim() == 0) return t.clone();
  switch (pick(rng, 0, 3)) {
    case 0:
      return t.clone();
    case 1: {  // stored in a permuted order
      std::vector<int64_t> perm(static_cast<size_t>(t.dim())), inverse(perm.size());
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (size_t i = 0; i < perm.size(); ++i)
        inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
      return t.permute(perm).contiguous().permute(inverse);
    }
    case 2: {  // gaps in one dim
      const int64_t d = pick(rng, 0, static_cast<int>(t.dim()) - 1);
      Shape big = t.shape();
      big[static_cast<size_t>(d)] = 2 * big[static_cast<size_t>(d)] + 1;
      Tensor g = full(big, -100, {.dtype = t.dtype()}).slice(d, 1, big[static_cast<size_t>(d)], 2);
      g.copy_(t);
      return g;
    }
    default: {  // an offset into a larger buffer
      Tensor b = full({t.numel() + 7}, -100, {.dtype = t.dtype()});
      Tensor v = b.slice(0, 7, t.numel() + 7).view(t.shape());
      v.copy_(t);
      return v;
    }
  }
}

// A shape that broadcasts to `out`: some dims set to 1, some leading dims dropped.
Shape broadcastable(const Shape& out, Rng& rng) {
  Shape s(out.begin() + pick(rng, 0, static_cast<int>(out.size())), out.end());
  for (int64_t& v : s)
    if (pick(rng, 0, 2) == 0) v = 1;
  return s;
}

Tensor small_ints(const Shape& shape, DType dtype, Rng& rng) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (double& x : v) x = pick(rng, -9, 9);
  return tensor_of(v, shape, dtype);
}

std::vector<int64_t> index_into(const std::vector<int64_t>& out_idx, const Tensor& t) {
  std::vector<int64_t> idx(static_cast<size_t>(t.dim()));
  const size_t lead = out_idx.size() - idx.size();
  for (size_t d = 0; d < idx.size(); ++d) idx[d] = t.shape()[d] == 1 ? 0 : out_idx[lead + d];
  return idx;
}

}  // namespace

TEST_CASE("elementwise loops are right for random layouts and broadcasts", "[elementwise]") {
  Rng rng(2718);
  const std::vector<DType> dtypes = {DType::f32, DType::i32, DType::f64, DType::i64, DType::f16};
  for (int trial = 0; trial < 300; ++trial) {
    Shape out(static_cast<size_t>(pick(rng, 0, 4)));
    for (int64_t& s : out) s = pick(rng, 1, 5);
    const DType da = dtypes[static_cast<size_t>(pick(rng, 0, 4))];
    const DType db = dtypes[static_cast<size_t>(pick(rng, 0, 4))];
    const Tensor a0 = small_ints(broadcastable(out, rng), da, rng);
    const Tensor b0 = small_ints(out, db, rng);  // b has the full shape: the result does too
    const Tensor a = random_layout(a0, rng), b = random_layout(b0, rng);
    INFO("a " << a.meta_str() << " strides " << shape_str(a.strides()) << ", b " << b.meta_str()
              << " strides " << shape_str(b.strides()));
    // a * b - 3 a, and the comparison a < b, element by element.
    std::vector<double> prod, less;
    for_each_index(out, [&](const std::vector<int64_t>& i) {
      const double x = at(a0, index_into(i, a0)), y = at(b0, i);
      prod.push_back(x * y - 3 * x);
      less.push_back(x < y);
    });
    KILN_CHECK_EQUAL(sub(a * b, a, 3), tensor_of(prod, out, DType::f64));
    KILN_CHECK_EQUAL(a < b, tensor_of(less, out, DType::f64));
    // In place into a random layout of b's shape.
    Tensor target = random_layout(b0.to(promote_types(da, db)), rng);
    const Tensor base = target;  // the same view
    target.mul_(a).sub_(a, 3);
    KILN_CHECK_EQUAL(base, tensor_of(prod, out, DType::f64));
    // Writing left the storage around a gapped or offset target alone.
    const int64_t capacity = static_cast<int64_t>(target.storage()->nbytes / target.itemsize());
    const std::vector<double> all = values(make_view(target, {capacity}, {1}, 0));
    CHECK(std::count(all.begin(), all.end(), -100.0) == capacity - target.numel());
  }
}
