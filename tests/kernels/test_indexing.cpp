// Indexing ops against naive loops. Inputs are small integers (exact in every dtype), so
// most results compare exactly; accumulating ops state their tolerance.
#include <algorithm>
#include <numeric>

#include "core/ops/indexing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Pseudo-random indices in [0, bound), as i64.
Tensor indices(const Shape& shape, int64_t bound, int64_t seed = 0) {
  std::vector<int64_t> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<int64_t>(i) * 5 + seed * 3 + 1) % bound;
  return from_vector<int64_t>(v, shape);
}

std::vector<int64_t> with(std::vector<int64_t> idx, int64_t dim, int64_t value) {
  idx[dim] = value;
  return idx;
}

}  // namespace

TEST_CASE("gather picks along dim for every dtype and layout", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({3, 4, 5}, dtype);
  for (int64_t dim : {0, 1, 2}) {
    CAPTURE(dim);
    Shape ishape = {2, 3, 4};  // smaller than x outside dim, longer along it
    ishape[dim] = 6;
    const Tensor index = indices(ishape, x.size(dim), dim);
    std::vector<double> v;
    for_each_index(ishape, [&](const std::vector<int64_t>& i) {
      v.push_back(at(x, with(i, dim, static_cast<int64_t>(at(index, i)))));
    });
    const Tensor expected = tensor_of(v, ishape, dtype);
    KILN_CHECK_EQUAL(gather(x, dim, index), expected);
    KILN_CHECK_EQUAL(gather(strided_copy(x), dim - 3, transposed_copy(index)), expected);
    KILN_CHECK_EQUAL(gather(transposed_copy(x), dim, strided_copy(index)), expected);
  }
  KILN_CHECK_EQUAL(gather(small_integers({}, dtype, 3), 0, from_vector<int64_t>({0}, Shape{})),
                   small_integers({}, dtype, 3));
}

TEST_CASE("gather rejects bad input", "[index][indexing]") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(
      gather(x, 1, from_vector<int64_t>({0, 5}, {1, 2})),
      Catch::Contains("gather") && Catch::Contains("index 5") && Catch::Contains("size 3"));
  CHECK_THROWS_WITH(gather(x, 1, from_vector<int64_t>({-1}, {1, 1})),
                    Catch::Contains("gather") && Catch::Contains("index -1"));
  CHECK_THROWS_WITH(gather(x, 1, from_vector<int32_t>({0}, {1, 1})),
                    Catch::Contains("gather") && Catch::Contains("i32[1,1] cpu"));
  CHECK_THROWS_WITH(gather(x, 0, from_vector<int64_t>({0}, {1})),
                    Catch::Contains("gather") && Catch::Contains("i64[1] cpu"));
  CHECK_THROWS_WITH(gather(x, 0, zeros({1, 4}, {.dtype = DType::i64})),
                    Catch::Contains("gather") && Catch::Contains("[1,4]"));
  CHECK_THROWS_WITH(gather(x, 2, zeros({1, 1}, {.dtype = DType::i64})), Catch::Contains("gather"));
}

TEST_CASE("scatter_add accumulates repeated indices out of place", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({3, 4, 2}, dtype, 1);
  for (int64_t dim : {0, 1, 2}) {
    CAPTURE(dim);
    Shape ishape = {2, 3, 2};
    ishape[dim] = 5;  // more entries than x has along dim: indices repeat
    Shape sshape = ishape;
    sshape[(dim + 1) % 3] += 1;  // src may be larger than the index
    const Tensor index = indices(ishape, x.size(dim), dim);
    const Tensor src = small_integers(sshape, dtype, 7);
    std::vector<double> v = values(x);
    const Shape& xs = x.shape();
    for_each_index(ishape, [&](const std::vector<int64_t>& i) {
      const std::vector<int64_t> o = with(i, dim, static_cast<int64_t>(at(index, i)));
      double& dst = v[static_cast<size_t>((o[0] * xs[1] + o[1]) * xs[2] + o[2])];
      dst = dtype == DType::boolean ? static_cast<double>(dst != 0 || at(src, i) != 0)
                                    : dst + at(src, i);
    });
    const Tensor expected = tensor_of(v, xs, dtype);
    KILN_CHECK_EQUAL(scatter_add(x, dim, index, src), expected);
    KILN_CHECK_EQUAL(
        scatter_add(transposed_copy(x), dim, strided_copy(index), transposed_copy(src)), expected);
  }
  // Out of place: the input is unchanged.
  const Tensor before = x.clone();
  scatter_add(x, 0, indices({1, 4, 2}, 3), small_integers({1, 4, 2}, dtype));
  KILN_CHECK_EQUAL(x, before);
}

TEST_CASE("scatter_add rejects bad input", "[index][indexing]") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(
      scatter_add(x, 0, from_vector<int64_t>({2}, {1, 1}), zeros({1, 1})),
      Catch::Contains("scatter_add") && Catch::Contains("index 2") && Catch::Contains("size 2"));
  CHECK_THROWS_WITH(
      scatter_add(x, 0, from_vector<int64_t>({0}, {1, 1}), zeros({1, 1}, {.dtype = DType::f64})),
      Catch::Contains("scatter_add") && Catch::Contains("f64[1,1] cpu"));
  CHECK_THROWS_WITH(
      scatter_add(x, 0, zeros({2, 2}, {.dtype = DType::i64}), zeros({1, 2})),
      Catch::Contains("scatter_add") && Catch::Contains("[2,2]") && Catch::Contains("[1,2]"));
  CHECK_THROWS_WITH(scatter_add(x, 1, zeros({3, 1}, {.dtype = DType::i64}), zeros({3, 1})),
                    Catch::Contains("scatter_add"));
}

TEST_CASE("gather / scatter_add and index_select split large work across threads",
          "[index][indexing]") {
  // 96 lines of 700: above the parallel grain, so threads share the lines.
  const Tensor x = randn({96, 700});
  const Tensor index = indices({96, 700}, 700, 3);
  const Tensor g = gather(x, 1, index);
  const Tensor s = scatter_add(zeros({96, 700}), 1, index, x);
  const Tensor rows = index_select(x.t(), 0, index.select(0, 5));
  std::vector<double> gv, sv(96 * 700, 0.0), rv;
  const std::vector<double> xv = values(x), iv = values(index);
  for (size_t r = 0; r < 96; ++r)
    for (size_t c = 0; c < 700; ++c) {
      const auto k = static_cast<size_t>(iv[r * 700 + c]);
      gv.push_back(xv[r * 700 + k]);
      sv[r * 700 + k] += xv[r * 700 + c];
    }
  for (size_t j = 0; j < 700; ++j)
    for (size_t r = 0; r < 96; ++r)
      rv.push_back(xv[r * 700 + static_cast<size_t>(iv[5 * 700 + j])]);
  KILN_CHECK_EQUAL(g, tensor_of(gv, {96, 700}));
  // Each output sums a handful of values in index order: f32 rounding only.
  KILN_CHECK_CLOSE(s, tensor_of(sv, {96, 700}, DType::f64), 1e-5, 1e-5);
  KILN_CHECK_EQUAL(rows, tensor_of(rv, {700, 96}));
}

TEST_CASE("index_select takes i64 and i32 indices", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  const DType itype = GENERATE(DType::i64, DType::i32);
  CAPTURE(dtype, itype);
  const Tensor x = small_integers({3, 4, 5}, dtype);
  for (int64_t dim : {0, 1, 2}) {
    CAPTURE(dim);
    const Tensor index = indices({7}, x.size(dim), dim).to(itype);
    Shape shape = x.shape();
    shape[dim] = 7;
    std::vector<double> v;
    for_each_index(shape, [&](const std::vector<int64_t>& i) {
      v.push_back(at(x, with(i, dim, static_cast<int64_t>(at(index, {i[dim]})))));
    });
    const Tensor expected = tensor_of(v, shape, dtype);
    KILN_CHECK_EQUAL(index_select(x, dim, index), expected);
    KILN_CHECK_EQUAL(index_select(strided_copy(x), dim - 3, strided_copy(index)), expected);
    KILN_CHECK_EQUAL(index_select(transposed_copy(x), dim, index), expected);
  }
  // A 0-d index keeps the dim with size 1; an empty index gives size 0.
  CHECK(index_select(x, 1, from_vector<int64_t>({2}, Shape{})).shape() == Shape{3, 1, 5});
  CHECK(index_select(x, 1, zeros({0}, {.dtype = DType::i64})).shape() == Shape{3, 0, 5});
}

TEST_CASE("index_select rejects bad input", "[index][indexing]") {
  const Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(
      index_select(x, 1, from_vector<int64_t>({0, 3})),
      Catch::Contains("index_select") && Catch::Contains("index 3") && Catch::Contains("size 3"));
  CHECK_THROWS_WITH(index_select(x, 0, zeros({1, 1}, {.dtype = DType::i64})),
                    Catch::Contains("index_select") && Catch::Contains("i64[1,1] cpu"));
  CHECK_THROWS_WITH(index_select(x, 0, zeros({1})),
                    Catch::Contains("index_select") && Catch::Contains("f32[1] cpu"));
}

TEST_CASE("embedding looks up rows / embedding_backward sums them", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kFloatDTypes));
  CAPTURE(dtype);
  const Tensor weight = small_integers({5, 3}, dtype);
  const Tensor idx = from_vector<int64_t>({4, 0, 2, 2, 1, 4}, {2, 3});
  std::vector<double> v;
  for_each_index({2, 3, 3}, [&](const std::vector<int64_t>& i) {
    v.push_back(at(weight, {static_cast<int64_t>(at(idx, {i[0], i[1]})), i[2]}));
  });
  const Tensor expected = tensor_of(v, {2, 3, 3}, dtype);
  KILN_CHECK_EQUAL(embedding(weight, idx), expected);
  KILN_CHECK_EQUAL(embedding(transposed_copy(weight), idx.to(DType::i32), 1), expected);
  KILN_CHECK_EQUAL(embedding(weight, transposed_copy(idx)), expected);

  // Backward: row r sums the grad rows whose index is r; padding_idx's row stays zero.
  const Tensor grad = small_integers({2, 3, 3}, dtype, 3);
  for (int64_t padding : {-1, 2, 4}) {
    CAPTURE(padding);
    std::vector<double> acc(15, 0.0);
    for_each_index({2, 3, 3}, [&](const std::vector<int64_t>& i) {
      const auto r = static_cast<int64_t>(at(idx, {i[0], i[1]}));
      if (r != padding) acc[static_cast<size_t>(r * 3 + i[2])] += at(grad, i);
    });
    const std::optional<int64_t> p = padding < 0 ? std::nullopt : std::optional<int64_t>(padding);
    const Tensor expected_grad = tensor_of(acc, {5, 3}, DType::f64);
    // Sums of at most two small integers: exact in every float type.
    KILN_CHECK_EQUAL(embedding_backward(grad, idx, 5, p), expected_grad);
    KILN_CHECK_EQUAL(embedding_backward(strided_copy(grad), idx.to(DType::i32), 5, p),
                     expected_grad);
    CHECK(embedding_backward(grad, idx, 5, p).dtype() == dtype);
  }
  // A negative padding_idx counts from the end.
  KILN_CHECK_EQUAL(embedding_backward(grad, idx, 5, -1), embedding_backward(grad, idx, 5, 4));
}

TEST_CASE("embedding_backward accumulates many rows in parallel", "[index][indexing]") {
  // 2048 lookups into 7 rows of width 64: each row sums ~290 values of 0.5.
  const Tensor idx = indices({2048}, 7);
  const Tensor grad = full({2048, 64}, 0.5);
  const Tensor g = embedding_backward(grad, idx, 7);
  std::vector<double> counts(7, 0.0);
  for (double r : values(idx)) counts[static_cast<size_t>(r)] += 0.5;
  std::vector<double> v;
  for (int64_t r = 0; r < 7; ++r)
    for (int64_t c = 0; c < 64; ++c) v.push_back(counts[static_cast<size_t>(r)]);
  KILN_CHECK_EQUAL(g, tensor_of(v, {7, 64}));
}

TEST_CASE("embedding rejects bad input", "[index][indexing]") {
  const Tensor w = zeros({4, 2});
  CHECK_THROWS_WITH(embedding(w, from_vector<int64_t>({1, 4})), Catch::Contains("embedding") &&
                                                                    Catch::Contains("index 4") &&
                                                                    Catch::Contains("size 4"));
  CHECK_THROWS_WITH(embedding(zeros({4}), from_vector<int64_t>({1})), Catch::Contains("embedding"));
  CHECK_THROWS_WITH(embedding(w, zeros({2})),
                    Catch::Contains("embedding") && Catch::Contains("f32[2] cpu"));
  CHECK_THROWS_WITH(embedding(w, from_vector<int64_t>({1}), 4), Catch::Contains("padding_idx"));
  CHECK_THROWS_WITH(embedding_backward(zeros({3, 2}), from_vector<int64_t>({0, 1}), 4),
                    Catch::Contains("embedding_backward") && Catch::Contains("f32[3,2] cpu"));
  CHECK_THROWS_WITH(embedding_backward(zeros({2, 2}), from_vector<int64_t>({0, 9}), 4),
                    Catch::Contains("embedding_backward") && Catch::Contains("index 9"));
  CHECK_THROWS_WITH(
      embedding_backward(zeros({2, 2}, {.dtype = DType::i64}), from_vector<int64_t>({0, 1}), 4),
      Catch::Contains("embedding_backward"));
}

TEST_CASE("one_hot encodes classes / inferring their number", "[index][indexing]") {
  const Tensor idx = from_vector<int64_t>({2, 0, 1, 2}, {2, 2});
  const Tensor r = one_hot(idx);
  CHECK(r.dtype() == DType::i64);
  KILN_CHECK_EQUAL(r, tensor_of({0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1}, {2, 2, 3}));
  KILN_CHECK_EQUAL(one_hot(transposed_copy(idx), 4),
                   tensor_of({0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, {2, 2, 4}));
  CHECK(one_hot(zeros({0}, {.dtype = DType::i64}), 3).shape() == Shape{0, 3});
  CHECK_THROWS_WITH(one_hot(idx, 2), Catch::Contains("one_hot") && Catch::Contains("2"));
  CHECK_THROWS_WITH(one_hot(from_vector<int64_t>({-1, 0})),
                    Catch::Contains("one_hot") && Catch::Contains("-1"));
  CHECK_THROWS_WITH(one_hot(zeros({0}, {.dtype = DType::i64})),
                    Catch::Contains("one_hot") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(one_hot(idx.to(DType::i32), 3),
                    Catch::Contains("one_hot") && Catch::Contains("i32[2,2] cpu"));
}

TEST_CASE("flip reverses the given dims", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({2, 3, 4}, dtype);
  const std::vector<std::vector<int64_t>> cases = {{}, {0}, {2}, {-1, 0}, {0, 1, 2}, {1}};
  for (const auto& dims : cases) {
    CAPTURE(dims);
    std::vector<double> v;
    for_each_index(x.shape(), [&](std::vector<int64_t> i) {
      for (int64_t d : dims) {
        const int64_t w = d < 0 ? d + 3 : d;
        i[w] = x.size(w) - 1 - i[w];
      }
      v.push_back(at(x, i));
    });
    const Tensor expected = tensor_of(v, x.shape(), dtype);
    KILN_CHECK_EQUAL(flip(x, dims), expected);
    KILN_CHECK_EQUAL(flip(strided_copy(x), dims), expected);
    KILN_CHECK_EQUAL(flip(transposed_copy(x), dims), expected);
  }
  CHECK_THROWS_WITH(flip(x, {0, -3}), Catch::Contains("flip") && Catch::Contains("twice"));
  CHECK_THROWS_WITH(flip(x, {3}), Catch::Contains("flip"));
}

TEST_CASE("tril and triu keep a triangle of the last two dims", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  for (const Shape& shape : {Shape{4, 4}, Shape{2, 3, 5}, Shape{5, 2}}) {
    const Tensor x = small_integers(shape, dtype, 1);
    for (int64_t diagonal : {-2, -1, 0, 1, 3}) {
      CAPTURE(shape, diagonal);
      std::vector<double> lower, upper;
      for_each_index(shape, [&](const std::vector<int64_t>& i) {
        const int64_t j = i.back() - i[i.size() - 2];
        lower.push_back(j <= diagonal ? at(x, i) : 0.0);
        upper.push_back(j >= diagonal ? at(x, i) : 0.0);
      });
      KILN_CHECK_EQUAL(tril(x, diagonal), tensor_of(lower, shape, dtype));
      KILN_CHECK_EQUAL(triu(x, diagonal), tensor_of(upper, shape, dtype));
      KILN_CHECK_EQUAL(tril(transposed_copy(x), diagonal), tensor_of(lower, shape, dtype));
      KILN_CHECK_EQUAL(triu(strided_copy(x), diagonal), tensor_of(upper, shape, dtype));
    }
  }
  CHECK_THROWS_WITH(tril(zeros({3}), 0), Catch::Contains("tril") && Catch::Contains("f32[3] cpu"));
  CHECK_THROWS_WITH(triu(zeros({}), 0), Catch::Contains("triu"));
}

TEST_CASE("cumsum sums along dim / integers give i64", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({3, 4, 5}, dtype);
  const DType out_dtype = is_floating(dtype) ? dtype : DType::i64;
  for (int64_t dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    const int64_t w = dim < 0 ? dim + 3 : dim;
    std::vector<double> v;
    for_each_index(x.shape(), [&](const std::vector<int64_t>& i) {
      double s = 0;
      for (int64_t k = 0; k <= i[w]; ++k) s += at(x, with(i, w, k));
      v.push_back(s);
    });
    const Tensor expected = tensor_of(v, x.shape(), DType::f64);
    const Tensor r = cumsum(x, dim);
    CHECK(r.dtype() == out_dtype);
    // Sums stay below 70: exact except bf16 (8 bits of mantissa: 0.4% relative).
    const double rtol = dtype == DType::bf16 ? 4e-3 : 0.0;
    KILN_CHECK_CLOSE(r, expected, rtol, 0.0);
    KILN_CHECK_CLOSE(cumsum(strided_copy(x), dim), expected, rtol, 0.0);
    KILN_CHECK_CLOSE(cumsum(transposed_copy(x), dim), expected, rtol, 0.0);
    const Tensor as_f64 = cumsum(x, dim, DType::f64);
    CHECK(as_f64.dtype() == DType::f64);
    KILN_CHECK_EQUAL(as_f64, expected);
  }
}

TEST_CASE("cumsum over long lines and its errors", "[index][indexing]") {
  // 3 x 20000 ones along dim 1 (several threads' worth): exact running counts.
  const Tensor x = ones({3, 20000});
  const Tensor r = cumsum(x, 1);
  KILN_CHECK_EQUAL(r.select(1, 19999), full({3}, 20000.0));
  KILN_CHECK_EQUAL(cumsum(x.t(), 0).t(), r);
  // f16 rounds the output only: 0.1 summed 1000 times stays close to 100.
  const Tensor h = cumsum(full({1000}, 0.1, {.dtype = DType::f16}), 0);
  CHECK(std::fabs(at(h, {999}) - 99.98) < 0.1);
  CHECK(cumsum(zeros({}), 0).shape() == Shape{});
  CHECK_THROWS_WITH(cumsum(zeros({2, 3}), 2),
                    Catch::Contains("cumsum") && Catch::Contains("dim 2"));
}

namespace {

// Naive stable sort of each line along `dim`, NaN largest; first k of each line.
std::pair<Tensor, Tensor> reference_sort(const Tensor& x, int64_t dim, int64_t k, bool descending) {
  Shape shape = x.shape();
  shape[dim] = k;
  std::vector<double> vals, idxs;
  for_each_index(shape, [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> order(static_cast<size_t>(x.size(dim)));
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int64_t j) { return at(x, with(i, dim, j)); };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double u = key(a), v = key(b);
      if (std::isnan(u) != std::isnan(v)) return descending ? std::isnan(u) : std::isnan(v);
      return descending ? u > v : u < v;
    });
    vals.push_back(key(order[static_cast<size_t>(i[dim])]));
    idxs.push_back(static_cast<double>(order[static_cast<size_t>(i[dim])]));
  });
  return {tensor_of(vals, shape, DType::f64), tensor_of(idxs, shape, DType::i64)};
}

}  // namespace

TEST_CASE("sort and topk order lines stably / with positions", "[index][indexing]") {
  const DType dtype = GENERATE(from_range(kAllDTypes));
  CAPTURE(dtype);
  const Tensor x = small_integers({3, 6, 4}, dtype, 2);  // values repeat: ties must stay in order
  for (int64_t dim : {0, 1, 2}) {
    for (bool descending : {false, true}) {
      CAPTURE(dim, descending);
      auto [ev, ei] = reference_sort(x, dim, x.size(dim), descending);
      auto [v, i] = sort(x, dim, descending, true);
      CHECK(v.dtype() == dtype);
      CHECK(i.dtype() == DType::i64);
      KILN_CHECK_EQUAL(v, ev);
      KILN_CHECK_EQUAL(i, ei);
      auto [sv, si] = sort(transposed_copy(x), dim - 3, descending);
      KILN_CHECK_EQUAL(sv, ev);
      KILN_CHECK_EQUAL(si, ei);
      const int64_t k = x.size(dim) - 1;
      auto [tv_expected, ti_expected] = reference_sort(x, dim, k, descending);
      auto [tv, ti] = topk(strided_copy(x), k, dim, descending);
      KILN_CHECK_EQUAL(tv, tv_expected);
      KILN_CHECK_EQUAL(ti, ti_expected);
    }
  }
}

TEST_CASE("sort and topk put NaN first when descending / last when ascending", "[index][indexing]") {
  const double nan = std::nan("");
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::f16, DType::bf16);
  CAPTURE(dtype);
  const Tensor x = tensor_of({3, nan, -1, 7, nan, 0}, {6}, dtype);
  auto [v, i] = sort(x);
  KILN_CHECK_EQUAL(v, tensor_of({-1, 0, 3, 7, nan, nan}, {6}));
  KILN_CHECK_EQUAL(i, tensor_of({2, 5, 0, 3, 1, 4}, {6}));
  auto [tv, ti] = topk(x, 3);
  KILN_CHECK_EQUAL(tv, tensor_of({nan, nan, 7}, {3}));
  KILN_CHECK_EQUAL(ti, tensor_of({1, 4, 3}, {3}));
  auto [bv, bi] = topk(x, 2, 0, false);
  KILN_CHECK_EQUAL(bv, tensor_of({-1, 0}, {2}));
  KILN_CHECK_EQUAL(bi, tensor_of({2, 5}, {2}));
}

TEST_CASE("topk and sort edge cases and errors", "[index][indexing]") {
  const Tensor x = small_integers({2, 3}, DType::f32);
  CHECK(topk(x, 0).first.shape() == Shape{2, 0});
  auto [v, i] = sort(from_vector<float>({5.0f}, Shape{}));
  CHECK(v.shape() == Shape{});
  CHECK(i.item<int64_t>() == 0);
  // A long line sorted against std::sort.
  const Tensor big = randn({4000});
  std::vector<double> expected = values(big);
  std::sort(expected.begin(), expected.end());
  KILN_CHECK_EQUAL(sort(big).first, tensor_of(expected, {4000}, DType::f64));
  CHECK_THROWS_WITH(topk(x, 4),
                    Catch::Contains("topk") && Catch::Contains("k 4") && Catch::Contains("size 3"));
  CHECK_THROWS_WITH(topk(x, -1), Catch::Contains("topk"));
  CHECK_THROWS_WITH(topk(x, 1, 2), Catch::Contains("topk") && Catch::Contains("dim 2"));
  CHECK_THROWS_WITH(sort(x, -3), Catch::Contains("sort") && Catch::Contains("dim -3"));
}
