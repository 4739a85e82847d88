// Reductions: dtype rules, empty tensors, NaN and infinities, accuracy of long sums, the
// registered ops, and the errors bad input gets.
#include <cmath>
#include <limits>

#include "core/ops/reduce.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("reduction result dtypes follow PyTorch", "[reduce]") {
  const Tensor i32 = tensor_of({1, 2, 3}, {3}, DType::i32);
  const Tensor u8 = tensor_of({200, 100}, {2}, DType::u8);
  const Tensor b = tensor_of({1, 0, 1}, {3}, DType::boolean);
  CHECK(sum(i32).dtype() == DType::i64);
  KILN_CHECK_EQUAL(sum(u8), scalar_tensor(300, DType::i64));  // no u8 wraparound
  KILN_CHECK_EQUAL(sum(b), scalar_tensor(2, DType::i64));
  KILN_CHECK_EQUAL(prod(i32), scalar_tensor(6, DType::i64));
  CHECK(prod(b).dtype() == DType::i64);
  CHECK(sum(i32, {}, false, DType::f64).dtype() == DType::f64);
  CHECK(sum(tensor_of({1.5}, {1}, DType::f16)).dtype() == DType::f16);
  KILN_CHECK_EQUAL(mean(i32, {}, false, DType::f32), scalar_tensor(2, DType::f32));
  CHECK(max(i32).dtype() == DType::i32);
  CHECK(amax(b).dtype() == DType::boolean);
  CHECK(argmax(b).dtype() == DType::i64);
  CHECK(logsumexp(i32).dtype() == DType::f32);
  CHECK(all(tensor_of({1.5, 0}, {2})).dtype() == DType::boolean);
  CHECK(var(tensor_of({1, 2}, {2}, DType::bf16)).dtype() == DType::bf16);
}

TEST_CASE("0-d tensors reduce to themselves", "[reduce]") {
  const Tensor x = scalar_tensor(2.5, DType::f32);
  KILN_CHECK_EQUAL(sum(x), x);
  KILN_CHECK_EQUAL(sum(x, {0}), x);
  KILN_CHECK_EQUAL(sum(x, {-1}, true), x);
  CHECK(sum(x, {0}, true).dim() == 0);
  KILN_CHECK_EQUAL(max(x, 0).values, x);
  KILN_CHECK_EQUAL(argmax(x), scalar_tensor(0, DType::i64));
  CHECK_THROWS_WITH(sum(x, {1}), Catch::Contains("sum") && Catch::Contains("out of range"));
}

TEST_CASE("empty reductions give the identity / or NaN for mean and var", "[reduce]") {
  const Tensor e = zeros({0}, {.dtype = DType::f32});
  KILN_CHECK_EQUAL(sum(e), scalar_tensor(0, DType::f32));
  KILN_CHECK_EQUAL(prod(e), scalar_tensor(1, DType::f32));
  KILN_CHECK_EQUAL(mean(e), scalar_tensor(kNan, DType::f32));
  KILN_CHECK_EQUAL(var(e), scalar_tensor(kNan, DType::f32));
  KILN_CHECK_EQUAL(logsumexp(e), scalar_tensor(-kInf, DType::f32));
  KILN_CHECK_EQUAL(norm(e), scalar_tensor(0, DType::f32));
  KILN_CHECK_EQUAL(all(e), scalar_tensor(true, DType::boolean));
  KILN_CHECK_EQUAL(any(e), scalar_tensor(false, DType::boolean));
  KILN_CHECK_EQUAL(sum(zeros({0}, {.dtype = DType::i32})), scalar_tensor(0, DType::i64));

  // Reducing an empty dim of a non-empty shape; reducing a full dim of an empty shape.
  const Tensor rows = zeros({0, 3});
  KILN_CHECK_EQUAL(sum(rows, {0}), zeros({3}));
  KILN_CHECK_EQUAL(prod(rows, {0}, true), ones({1, 3}));
  CHECK(sum(rows, {1}).shape() == Shape{0});
  CHECK(amax(rows, {1}).shape() == Shape{0});  // every reduction has elements: no error
  const ValuesIndices m = max(rows, 1, true);
  CHECK(m.values.shape() == Shape{0, 1});
  CHECK(m.indices.shape() == Shape{0, 1});
}

TEST_CASE("ops without an identity reject empty reductions / naming the op", "[reduce]") {
  const Tensor e = zeros({0});
  const Tensor rows = zeros({0, 3});
  CHECK_THROWS_WITH(max(e), Catch::Contains("max") && Catch::Contains("no identity"));
  CHECK_THROWS_WITH(min(e), Catch::Contains("min") && Catch::Contains("f32[0] cpu"));
  CHECK_THROWS_WITH(amax(rows, {0}), Catch::Contains("amax") && Catch::Contains("[0,3]"));
  CHECK_THROWS_WITH(amin(e), Catch::Contains("amin"));
  CHECK_THROWS_WITH(max(rows, 0), Catch::Contains("max"));
  CHECK_THROWS_WITH(min(rows, 0, true), Catch::Contains("min"));
  CHECK_THROWS_WITH(argmax(e), Catch::Contains("argmax"));
  CHECK_THROWS_WITH(argmin(rows, 0), Catch::Contains("argmin"));
  CHECK_THROWS_WITH(norm(e, kInf), Catch::Contains("norm"));
  CHECK_THROWS_WITH(norm(e, -1), Catch::Contains("norm"));
}

TEST_CASE("bad dims / dtypes and inputs throw errors naming the op and the shape", "[reduce]") {
  const Tensor x = zeros({2, 3, 4});
  CHECK_THROWS_AS(sum(x, {3}), Error);
  CHECK_THROWS_WITH(sum(x, {3}), Catch::Contains("sum") && Catch::Contains("[2,3,4]") &&
                                     Catch::Contains("out of range"));
  CHECK_THROWS_WITH(mean(x, {-4}), Catch::Contains("mean") && Catch::Contains("[2,3,4]"));
  CHECK_THROWS_WITH(sum(x, {1, -2}), Catch::Contains("sum") && Catch::Contains("more than once"));
  CHECK_THROWS_WITH(amax(x, {0, 0}), Catch::Contains("amax") && Catch::Contains("more than once"));
  CHECK_THROWS_WITH(max(x, 5), Catch::Contains("max") && Catch::Contains("[2,3,4]"));
  CHECK_THROWS_WITH(argmin(x, -4), Catch::Contains("argmin") && Catch::Contains("[2,3,4]"));
  CHECK_THROWS_WITH(var(x, {7}), Catch::Contains("var"));
  CHECK_THROWS_WITH(logsumexp(x, {3}), Catch::Contains("logsumexp"));
  CHECK_THROWS_WITH(all(x, {2, 2}), Catch::Contains("all"));
  CHECK_THROWS_WITH(norm(x, 2, {9}), Catch::Contains("norm"));

  const Tensor ints = zeros({2, 3}, {.dtype = DType::i64});
  CHECK_THROWS_WITH(mean(ints), Catch::Contains("mean") && Catch::Contains("i64[2,3] cpu"));
  CHECK_THROWS_WITH(mean(x, {}, false, DType::i32),
                    Catch::Contains("mean") && Catch::Contains("i32"));
  CHECK_THROWS_WITH(var(ints), Catch::Contains("var") && Catch::Contains("i64[2,3]"));
  CHECK_THROWS_WITH(kiln::std(ints), Catch::Contains("std"));
  CHECK_THROWS_WITH(norm(ints), Catch::Contains("norm") && Catch::Contains("i64"));
  CHECK_THROWS_WITH(norm(x, std::nan("")), Catch::Contains("norm"));
  CHECK_THROWS_WITH(sum(Tensor()), Catch::Contains("sum"));
}

TEST_CASE("NaN propagates through max / min and their indices", "[reduce]") {
  for (DType dtype : kFloatDTypes) {
    INFO("dtype " << name(dtype));
    const Tensor x = tensor_of({1, kNan, 5, kNan, 2, 7}, {2, 3}, dtype);
    KILN_CHECK_EQUAL(max(x), scalar_tensor(kNan, dtype));
    KILN_CHECK_EQUAL(amin(x, {1}), tensor_of({kNan, kNan}, {2}));
    KILN_CHECK_EQUAL(amax(x, {0}), tensor_of({kNan, kNan, 7}, {3}));
    const ValuesIndices m = max(x, 1);
    KILN_CHECK_EQUAL(m.values, tensor_of({kNan, kNan}, {2}));
    KILN_CHECK_EQUAL(m.indices, tensor_of({1, 0}, {2}));
    KILN_CHECK_EQUAL(argmin(x), scalar_tensor(1, DType::i64));  // the first NaN
    KILN_CHECK_EQUAL(argmax(x, 0), tensor_of({1, 0, 1}, {3}));
    KILN_CHECK_EQUAL(norm(x, kInf, {0}), tensor_of({kNan, kNan, 7}, {3}));
  }
}

TEST_CASE("ties give the first position", "[reduce]") {
  const Tensor x = tensor_of({3, 1, 3, 1, 3, 1}, {6});
  KILN_CHECK_EQUAL(argmax(x), scalar_tensor(0, DType::i64));
  KILN_CHECK_EQUAL(argmin(x), scalar_tensor(1, DType::i64));
  const Tensor neg_inf = tensor_of({-kInf, -kInf}, {2});
  KILN_CHECK_EQUAL(argmax(neg_inf), scalar_tensor(0, DType::i64));
  KILN_CHECK_EQUAL(max(neg_inf), scalar_tensor(-kInf, DType::f32));
}

TEST_CASE("logsumexp is stable for large values and infinities", "[reduce]") {
  const Tensor x = tensor_of({1000, 1000, -kInf, -kInf, 3, kInf, -1000, -1000}, {4, 2});
  const Tensor expected =
      tensor_of({1000 + std::log(2.0), -kInf, kInf, -1000 + std::log(2.0)}, {4});
  KILN_CHECK_CLOSE(logsumexp(x, {1}), expected, 1e-6, 0);
  KILN_CHECK_CLOSE(logsumexp(tensor_of({kNan, 1}, {2})), scalar_tensor(kNan, DType::f32), 0, 0);
  KILN_CHECK_CLOSE(logsumexp(tensor_of({2, 3}, {2}, DType::f16)),
                   scalar_tensor(3 + std::log1p(std::exp(-1.0)), DType::f64), 2e-3, 0);
}

TEST_CASE("long sums stay accurate", "[reduce]") {
  // A float running sum of 1e6 copies of 0.1f drifts by ~1%; the kernels must not.
  const int64_t n = 1000000;
  const double tenth = static_cast<double>(0.1f);
  const Tensor x = full({n}, 0.1, {.dtype = DType::f32});
  KILN_CHECK_CLOSE(sum(x), scalar_tensor(n * tenth, DType::f64), 1e-7, 0);
  KILN_CHECK_CLOSE(mean(x), scalar_tensor(tenth, DType::f64), 1e-7, 0);
  // The same along dim 0 of [250000, 4] (rows accumulated) and along dim 1 of [4, 250000].
  KILN_CHECK_CLOSE(sum(x.view({250000, 4}), {0}), full({4}, 250000 * tenth, {.dtype = DType::f64}),
                   1e-7, 0);
  KILN_CHECK_CLOSE(sum(x.view({4, 250000}), {1}), full({4}, 250000 * tenth, {.dtype = DType::f64}),
                   1e-7, 0);
  // f16: a half-precision running sum would stop growing at 256.
  const Tensor h = full({10000}, 0.1, {.dtype = DType::f16});
  const double h_tenth = static_cast<double>(static_cast<float>(Half(0.1f)));
  KILN_CHECK_CLOSE(sum(h), scalar_tensor(10000 * h_tenth, DType::f64), 1e-3, 0);
  const Tensor bh = full({10000}, 0.1, {.dtype = DType::bf16});
  const double b_tenth = static_cast<double>(static_cast<float>(BFloat16(0.1f)));
  KILN_CHECK_CLOSE(sum(bh), scalar_tensor(10000 * b_tenth, DType::f64), 8e-3, 0);
  // var of values far from zero: the two-pass form keeps the small spread exact.
  const Tensor offset = (randn({100000}, {.dtype = DType::f64}) + 1e4).to(DType::f32);
  const Tensor spread = offset.to(DType::f64) - mean(offset.to(DType::f64));
  KILN_CHECK_CLOSE(var(offset), sum(spread * spread) / 99999.0, 1e-5, 0);
}

TEST_CASE("argmax over a long range finds the first of equal maxima", "[reduce]") {
  Tensor x = zeros({1000000});
  x.narrow(0, 700000, 1).fill_(5);
  x.narrow(0, 900000, 1).fill_(5);
  x.narrow(0, 100, 1).fill_(-5);
  KILN_CHECK_EQUAL(argmax(x), scalar_tensor(700000, DType::i64));
  KILN_CHECK_EQUAL(argmin(x), scalar_tensor(100, DType::i64));
  x.narrow(0, 800000, 1).fill_(kNan);
  x.narrow(0, 950000, 1).fill_(kNan);
  KILN_CHECK_EQUAL(argmax(x), scalar_tensor(800000, DType::i64));
  const ValuesIndices m = min(x.view({1000, 1000}), 0);
  KILN_CHECK_EQUAL(m.indices.narrow(0, 0, 1), tensor_of({800}, {1}));
}

TEST_CASE("reductions are registered ops with their dims as attributes", "[reduce]") {
  for (const char* op : {"sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin",
                         "var", "std", "logsumexp", "all", "any", "norm"})
    CHECK(find_op(op).kernels[static_cast<int>(DeviceType::cpu)] != nullptr);
  const Tensor x = tensor_of({1, 5, 3, 4}, {2, 2});
  const std::vector<Tensor> outs =
      call_op(find_op("max"), {x}, {{"dim", int64_t{1}}, {"keepdim", true}});
  REQUIRE(outs.size() == 2);
  KILN_CHECK_EQUAL(outs[0], tensor_of({5, 4}, {2, 1}));
  KILN_CHECK_EQUAL(outs[1], tensor_of({1, 1}, {2, 1}));
  Attrs seen;
  {
    OpHookGuard guard([&](const OpCall& call) { seen = call.attrs; });
    (void)sum(x, {-1}, true, DType::f64);
  }
  CHECK(seen.ints("dims") == DimList{-1});
  CHECK(seen.b("keepdim"));
  CHECK(seen.dtype("dtype") == DType::f64);
}

TEST_CASE("transposed / channels-last and expanded inputs agree with contiguous ones", "[reduce]") {
  // The contiguous results are checked against loops elsewhere; here only the summation
  // order may differ (rtol 1e-5 for f32), and max positions must match exactly.
  const Tensor t = randn({300, 200}).t();  // [200, 300] stored transposed
  const Tensor tc = t.contiguous();
  for (const DimList& dims : {DimList{}, DimList{0}, DimList{1}}) {
    INFO("dims [" << (dims.empty() ? -1 : dims[0]) << "] (-1: all)");
    KILN_CHECK_CLOSE(sum(t, dims, true), sum(tc, dims, true), 1e-5, 1e-5);
    KILN_CHECK_CLOSE(var(t, dims), var(tc, dims), 1e-5, 1e-5);
    KILN_CHECK_EQUAL(amin(t, dims), amin(tc, dims));
  }
  KILN_CHECK_EQUAL(argmax(t), argmax(tc));
  KILN_CHECK_EQUAL(argmax(t, 0), argmax(tc, 0));
  KILN_CHECK_EQUAL(min(t, 1, true).indices, min(tc, 1, true).indices);

  const Tensor nchw = randn({2, 5, 6, 3}).permute({0, 3, 1, 2});  // NHWC storage
  const Tensor nchw_c = nchw.contiguous();
  KILN_CHECK_CLOSE(mean(nchw, {0, 2, 3}), mean(nchw_c, {0, 2, 3}), 1e-5, 1e-6);
  KILN_CHECK_CLOSE(var(nchw, {0, 2, 3}, 0, true), var(nchw_c, {0, 2, 3}, 0, true), 1e-5, 1e-6);
  KILN_CHECK_CLOSE(sum(nchw, {1}), sum(nchw_c, {1}), 1e-5, 1e-6);
  KILN_CHECK_EQUAL(argmax(nchw), argmax(nchw_c));

  const Tensor e = randn({3, 1, 5}).expand({3, 4, 5});
  const Tensor ec = e.contiguous();
  KILN_CHECK_CLOSE(sum(e, {1}), sum(ec, {1}), 1e-6, 1e-6);
  KILN_CHECK_CLOSE(logsumexp(e, {0, 1}), logsumexp(ec, {0, 1}), 1e-6, 1e-6);
  KILN_CHECK_EQUAL(max(e, 1).indices, zeros({3, 5}, {.dtype = DType::i64}));
}

TEST_CASE("all and any of u8 give u8 as in PyTorch", "[reduce]") {
  Tensor x = from_vector<uint8_t>({0, 3, 1, 1}, {2, 2});
  CHECK(all(x).dtype() == DType::u8);
  CHECK(all(x).item<int64_t>() == 0);
  CHECK(any(x, {0}).dtype() == DType::u8);
  KILN_CHECK_EQUAL(any(x, {0}), from_vector<uint8_t>({1, 1}));
  KILN_CHECK_EQUAL(all(x, {1}), from_vector<uint8_t>({0, 1}));
  CHECK(all(from_vector<int32_t>({1, 2})).dtype() == DType::boolean);
}
