// Tensor views (PyTorch semantics): shapes, strides, storage sharing and the errors of
// view, reshape, permute, transpose, slice, narrow, select, expand, squeeze, flatten,
// unflatten and as_strided.
#include <algorithm>
#include <numeric>
#include <optional>
#include <random>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

Tensor iota(Shape shape, DType dtype = DType::f32) {
  return arange(numel_of(shape), {.dtype = dtype}).view(std::move(shape));
}
bool shares(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

}  // namespace

TEST_CASE("view shares storage and infers -1", "[view]") {
  Tensor x = iota({2, 6});
  Tensor v = x.view({3, -1});
  CHECK(v.shape() == Shape{3, 4});
  CHECK(v.strides() == Shape{4, 1});
  CHECK(shares(x, v));
  v.select(0, 2).fill_(-1);
  CHECK(values(x) == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1});
  CHECK(x.view({12}).shape() == Shape{12});
  CHECK(x.view({2, 1, 6, 1}).shape() == Shape{2, 1, 6, 1});
  CHECK_THROWS_WITH(x.view({5, -1}), Catch::Contains("view") && Catch::Contains("[5,-1]"));
  CHECK_THROWS_WITH(x.view({-1, -1}), Catch::Contains("only one dimension can be -1"));
  CHECK_THROWS_AS(x.view({13}), Error);
}

TEST_CASE("view of a non-contiguous tensor: splits work / merges across gaps fail", "[view]") {
  Tensor x = iota({4, 6});
  Tensor cols = x.slice(1, 0, 3);  // [4,3] strides [6,1]
  Tensor split = cols.view({2, 2, 3});
  CHECK(split.strides() == Shape{12, 6, 1});
  CHECK(at(split, {1, 1, 2}) == 20);
  CHECK_THROWS_WITH(cols.view({12}),
                    Catch::Contains("cannot view") && Catch::Contains("use reshape"));
  Tensor t = iota({2, 3}).t();
  CHECK_THROWS_WITH(t.view({6}), Catch::Contains("view: shape [6] cannot view f32[3,2] cpu") &&
                                     Catch::Contains("use reshape"));
  // reshape copies when a view is impossible, views otherwise.
  Tensor r = t.reshape({6});
  CHECK_FALSE(shares(r, t));
  CHECK(values(r) == std::vector<double>{0, 3, 1, 4, 2, 5});
  Tensor r2 = x.reshape({3, 8});
  CHECK(shares(r2, x));
  CHECK(shares(cols.reshape({2, 2, 3}), x));
}

TEST_CASE("permute / transpose and t", "[view]") {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(shares(p, x));
  for_each_index(p.shape(), [&](const std::vector<int64_t>& i) {
    CHECK(at(p, i) == static_cast<double>(i[1] * 12 + i[2] * 4 + i[0]));
  });
  CHECK(x.permute({-1, 0, 1}).shape() == Shape{4, 2, 3});
  CHECK_THROWS_WITH(x.permute({0, 0, 1}), Catch::Contains("permute") && Catch::Contains("repeats"));
  CHECK_THROWS_WITH(x.permute({0, 1}), Catch::Contains("permute: 2 dims given"));
  CHECK_THROWS_WITH(x.permute({0, 1, 3}), Catch::Contains("dim 3 is out of range"));

  Tensor tr = x.transpose(-1, 0);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(at(tr, {3, 2, 1}) == at(x, {1, 2, 3}));
  CHECK_FALSE(tr.is_contiguous());
  Tensor m = iota({2, 3});
  CHECK(m.t().shape() == Shape{3, 2});
  CHECK(at(m.t(), {2, 1}) == 5);
  Tensor v = iota({3});
  CHECK(v.t().same(v));
  CHECK_THROWS_WITH(x.t(), Catch::Contains("t: expects a tensor of at most 2 dims"));
}

TEST_CASE("slice with steps and negative bounds", "[view]") {
  Tensor a = iota({10});
  CHECK(values(a.slice(0, -7, -1, 2)) == std::vector<double>{3, 5, 7});
  CHECK(values(a.slice(0, 2, 100)) == std::vector<double>{2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(values(a.slice(0, -100, 2)) == std::vector<double>{0, 1});
  CHECK(a.slice(0, 5, 2).numel() == 0);  // end before start: empty, like a[5:2]
  CHECK(values(a.slice(0, 1, 10, 3)) == std::vector<double>{1, 4, 7});
  CHECK(values(a.slice(0, 0, 10, 4)) == std::vector<double>{0, 4, 8});
  Tensor m = iota({3, 4});
  Tensor s = m.slice(-1, 1, 4, 2);
  CHECK(s.shape() == Shape{3, 2});
  CHECK(s.strides() == Shape{4, 2});
  CHECK(s.offset() == 1);
  CHECK(values(s) == std::vector<double>{1, 3, 5, 7, 9, 11});
  CHECK_THROWS_WITH(a.slice(0, 0, 5, 0), Catch::Contains("slice: step must be positive"));
  CHECK_THROWS_WITH(a.slice(1, 0, 5), Catch::Contains("slice: dim 1 is out of range"));
  CHECK_THROWS_WITH(scalar_tensor(1, DType::f32).slice(0, 0, 1), Catch::Contains("0-d"));
}

TEST_CASE("narrow and select", "[view]") {
  Tensor a = iota({10});
  CHECK(values(a.narrow(0, -3, 2)) == std::vector<double>{7, 8});
  CHECK(values(a.narrow(0, 2, 3)) == std::vector<double>{2, 3, 4});
  CHECK_THROWS_WITH(a.narrow(0, 8, 3), Catch::Contains("narrow") && Catch::Contains("size 10"));
  Tensor m = iota({3, 4});
  Tensor row = m.select(0, -1);
  CHECK(row.shape() == Shape{4});
  CHECK(values(row) == std::vector<double>{8, 9, 10, 11});
  Tensor col = m.select(1, 2);
  CHECK(values(col) == std::vector<double>{2, 6, 10});
  CHECK(col.strides() == Shape{4});
  CHECK(values(m[1]) == std::vector<double>{4, 5, 6, 7});
  CHECK(m[1][2].dim() == 0);
  CHECK(m[1][2].item<float>() == 6);
  CHECK_THROWS_WITH(m.select(0, 3),
                    Catch::Contains("select: index 3 is out of range for dim 0 of size 3"));
  CHECK_THROWS_WITH(m.select(1, -5), Catch::Contains("select: index -5 is out of range"));
  CHECK_THROWS_WITH(m.select(2, 0), Catch::Contains("select: dim 2 is out of range"));
  CHECK_THROWS_WITH(m[1][2].select(0, 0), Catch::Contains("0-d"));
}

TEST_CASE("expand and broadcast_to", "[view]") {
  Tensor c = iota({3, 1});
  Tensor e = c.expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(shares(e, c));
  CHECK(at(e, {1, 2, 3}) == 2);
  CHECK(c.expand({-1, 5}).shape() == Shape{3, 5});
  CHECK(c.broadcast_to({3, 3}).shape() == Shape{3, 3});
  CHECK(iota({3}).expand({2, 3}).strides() == Shape{0, 1});
  CHECK_THROWS_WITH(iota({3}).expand({4}),
                    Catch::Contains("expand") && Catch::Contains("[3]") && Catch::Contains("[4]"));
  CHECK_THROWS_WITH(c.expand({3}), Catch::Contains("fewer dims"));
  CHECK_THROWS_WITH(c.broadcast_to({-1, 3, 2}), Catch::Contains("-1 is not allowed"));
}

TEST_CASE("squeeze / unsqueeze / flatten and unflatten", "[view]") {
  Tensor x = iota({1, 3, 1, 2});
  CHECK(x.squeeze().shape() == Shape{3, 2});
  CHECK(x.squeeze(2).shape() == Shape{1, 3, 2});
  CHECK(x.squeeze(-4).shape() == Shape{3, 1, 2});
  CHECK(x.squeeze(1).shape() == Shape{1, 3, 1, 2});  // not size 1: unchanged
  CHECK_THROWS_WITH(x.squeeze(4), Catch::Contains("squeeze: dim 4 is out of range"));
  CHECK(x.unsqueeze(0).shape() == Shape{1, 1, 3, 1, 2});
  CHECK(x.unsqueeze(-1).shape() == Shape{1, 3, 1, 2, 1});
  CHECK(x.unsqueeze(4).shape() == Shape{1, 3, 1, 2, 1});
  CHECK_THROWS_WITH(x.unsqueeze(5), Catch::Contains("unsqueeze: dim 5 is out of range"));
  Tensor s = scalar_tensor(2.0, DType::f32);
  CHECK(s.unsqueeze(0).shape() == Shape{1});
  CHECK(s.squeeze().dim() == 0);
  Tensor u = iota({3}).unsqueeze(1);
  CHECK(u.strides() == Shape{1, 1});
  CHECK(values(u.expand({3, 2})) == std::vector<double>{0, 0, 1, 1, 2, 2});

  Tensor y = iota({2, 3, 4});
  CHECK(y.flatten().shape() == Shape{24});
  CHECK(y.flatten(1).shape() == Shape{2, 12});
  CHECK(y.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(shares(y.flatten(), y));
  CHECK(s.flatten().shape() == Shape{1});
  Tensor yt = y.transpose(0, 2);
  Tensor ft = yt.flatten();  // not viewable: a copy in yt's logical order
  CHECK_FALSE(shares(ft, y));
  CHECK(values(ft) == values(yt));
  CHECK_THROWS_WITH(y.flatten(2, 1), Catch::Contains("flatten: start_dim 2 comes after end_dim 1"));
  Tensor uf = y.flatten(1).unflatten(1, {3, -1});
  CHECK(uf.shape() == Shape{2, 3, 4});
  CHECK(values(uf) == values(y));
  CHECK_THROWS_WITH(y.unflatten(1, {2, 2}), Catch::Contains("unflatten"));
}

TEST_CASE("as_strided views any window of the storage and checks bounds", "[view]") {
  Tensor a = iota({6});
  Tensor w = a.as_strided({4, 3}, {1, 1}, 0);  // sliding windows
  CHECK(values(w) == std::vector<double>{0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 5});
  CHECK(values(a.as_strided({2}, {2}, 3)) == std::vector<double>{3, 5});
  // A view of a view indexes the whole storage, from its offset argument.
  CHECK(values(a.slice(0, 2, 6).as_strided({2}, {1}, 0)) == std::vector<double>{0, 1});
  CHECK_THROWS_WITH(a.as_strided({4, 3}, {1, 1}, 1), Catch::Contains("as_strided") &&
                                                         Catch::Contains("reaches element 6") &&
                                                         Catch::Contains("holds 6"));
  CHECK_THROWS_WITH(a.as_strided({2}, {1, 1}, 0), Catch::Contains("differ in length"));
  CHECK_THROWS_AS(a.as_strided({2}, {-1}, 3), Error);
  CHECK(a.as_strided({0, 5}, {100, 100}, 0).numel() == 0);
}

TEST_CASE("writes through views reach the base tensor", "[view]") {
  Tensor x = zeros({3, 4});
  x.select(1, 2).fill_(5);                      // a column
  x.t().select(0, 0).fill_(1);                  // column 0 through a transpose
  x.slice(0, 2, 3).slice(1, 1, 4, 2).add_(10);  // row 2, columns 1 and 3
  x.view({12}).narrow(0, 4, 1).fill_(-2);       // element (1, 0)
  CHECK(values(x) == std::vector<double>{1, 0, 5, 0, -2, 0, 5, 0, 1, 10, 5, 10});
  const uint64_t v0 = x.storage()->version;
  x.select(0, 0).mul_(2);
  CHECK(x.storage()->version > v0);
}

TEST_CASE("contiguous returns the tensor itself or a packed copy", "[view]") {
  Tensor x = iota({2, 3});
  CHECK(x.contiguous().same(x));
  CHECK(x.is_contiguous());
  CHECK(x.view({3, 1, 2}).is_contiguous());
  Tensor t = x.t();
  CHECK_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Shape{2, 1});
  CHECK_FALSE(shares(c, x));
  CHECK(values(c) == std::vector<double>{0, 3, 1, 4, 2, 5});
  // Size-1 dims may have any stride and still count as contiguous.
  CHECK(x.slice(0, 1, 2).is_contiguous());
  CHECK(iota({4, 1}).expand({4, 1}).is_contiguous());
  CHECK_FALSE(iota({1, 4}).expand({3, 4}).is_contiguous());
  // An empty tensor is contiguous whatever its strides, as in PyTorch.
  CHECK(zeros({3, 0}).t().is_contiguous());
  CHECK(iota({4, 3}).slice(1, 0, 0).t().is_contiguous());
}

namespace {

// Strides that make `shape` read t's elements in t's row-major order, if any exist, found
// by brute force: the unit steps force every stride, then each element is checked.
std::optional<Shape> brute_force_strides(const Tensor& t, const Shape& shape) {
  std::vector<int64_t> addr;
  for_each_index(t.shape(), [&](const std::vector<int64_t>& i) {
    int64_t a = t.offset();
    for (size_t d = 0; d < i.size(); ++d) a += i[d] * t.strides()[d];
    addr.push_back(a);
  });
  const Shape unit = contiguous_strides(shape);
  Shape strides(shape.size(), 0);
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1) strides[d] = addr[static_cast<size_t>(unit[d])] - addr[0];
  bool ok = true;
  size_t k = 0;
  for_each_index(shape, [&](const std::vector<int64_t>& i) {
    int64_t a = addr[0];
    for (size_t d = 0; d < i.size(); ++d) a += i[d] * strides[d];
    ok = ok && a == addr[k++];
  });
  if (!ok) return std::nullopt;
  return strides;
}

// A random shape of `numel` elements in 1 to 4 dims (size-1 dims included).
Shape random_factorization(int64_t numel, std::mt19937& rng) {
  const int ndim = std::uniform_int_distribution<int>(1, 4)(rng);
  Shape s(static_cast<size_t>(ndim), 1);
  for (int64_t p = 2; numel > 1; ++p) {
    while (numel % p == 0) {
      s[std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng)] *= p;
      numel /= p;
    }
  }
  return s;
}

}  // namespace

TEST_CASE("view succeeds exactly when strides exist / and reshape agrees", "[view]") {
  std::mt19937 rng(12345);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int viewable = 0, not_viewable = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Shape shape(static_cast<size_t>(pick(1, 4)));
    for (int64_t& s : shape) s = pick(1, 4);
    Tensor t = iota(shape);
    std::vector<int64_t> perm(shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    t = t.permute(perm);
    const int64_t d = pick(0, static_cast<int>(t.dim()) - 1);
    if (pick(0, 1) && t.size(d) > 1) t = t.slice(d, pick(0, 1), t.size(d), pick(1, 2));
    if (pick(0, 3) == 0) {  // a broadcast (stride 0) dim
      const int64_t at_dim = pick(0, static_cast<int>(t.dim()));
      Shape wide = t.unsqueeze(at_dim).shape();
      wide[static_cast<size_t>(at_dim)] = pick(1, 3);
      t = t.unsqueeze(at_dim).expand(wide);
    }
    const Shape target = random_factorization(t.numel(), rng);
    INFO("shape " << shape_str(t.shape()) << " strides " << shape_str(t.strides()) << " -> "
                  << shape_str(target));
    const auto expected = brute_force_strides(t, target);
    if (expected) {
      ++viewable;
      Tensor v = t.view(target);
      CHECK(v.storage() == t.storage());
      CHECK(values(v) == values(t));
    } else {
      ++not_viewable;
      CHECK_THROWS_WITH(t.view(target), Catch::Contains("use reshape"));
      Tensor r = t.reshape(target);
      CHECK(r.storage() != t.storage());
      CHECK(values(r) == values(t));
    }
  }
  CHECK(viewable > 50);
  CHECK(not_viewable > 50);
}
