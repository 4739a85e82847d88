// Elementwise ops with options or special cases: where, clamp, gelu's two forms, softplus's
// threshold, NaN propagation, in-place forms (strided targets, dtype rules), a large
// multi-threaded broadcast, and the errors of bad input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/scalar.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("where selects with broadcasting and promotes its branches", "[elementwise]") {
  const Tensor cond = from_vector<bool>({true, false, true}, {3, 1});
  const Tensor a = f32s({1, 2, 3, 4}, {1, 4});
  const Tensor b =
      from_vector<int32_t>({-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12}, {3, 4});
  Tensor w = where(cond, a, b);
  CHECK(w.dtype() == DType::f32);
  CHECK(w.shape() == Shape{3, 4});
  CHECK(values(w) == std::vector<double>{1, 2, 3, 4, -5, -6, -7, -8, 1, 2, 3, 4});
  KILN_CHECK_EQUAL(where(strided_copy(cond), strided_copy(a), transposed_copy(b)), w);
  // A number branch: i32 with 2.5 gives f32; f16 with 2.5 stays f16; i32 with 7 stays i32.
  const Tensor c1 = from_vector<bool>({true, false});
  const Tensor i = from_vector<int32_t>({5, 6});
  CHECK(where(c1, i, 2.5).dtype() == DType::f32);
  CHECK(values(where(c1, i, 2.5)) == std::vector<double>{5, 2.5});
  CHECK(where(c1, i.to(DType::f16), 2.5).dtype() == DType::f16);
  CHECK(where(c1, 7, i).dtype() == DType::i32);
  CHECK(values(where(c1, 7, i)) == std::vector<double>{7, 6});
  const std::vector<double> nans = values(where(c1, f32s({NAN, 1}), f32s({0, NAN})));
  CHECK((std::isnan(nans[0]) && std::isnan(nans[1])));
  CHECK_THROWS_WITH(where(i, i, i), Catch::Contains("where: the condition must be bool") &&
                                        Catch::Contains("i32[2] cpu"));
  CHECK_THROWS_WITH(where(c1, i, from_vector<int32_t>({1, 2, 3})),
                    Catch::Contains("where") && Catch::Contains("[3]"));
}

TEST_CASE("clamp with min only / max only / both / and promoting bounds", "[elementwise]") {
  const Tensor x = f32s({-2, -0.5, 0, 0.5, 2});
  CHECK(values(clamp(x, -1, std::nullopt)) == std::vector<double>{-1, -0.5, 0, 0.5, 2});
  CHECK(values(clamp(x, std::nullopt, 1)) == std::vector<double>{-2, -0.5, 0, 0.5, 1});
  CHECK(values(clamp(x, -0.25, 0.25)) == std::vector<double>{-0.25, -0.25, 0, 0.25, 0.25});
  CHECK(values(clamp_min(x, 0)) == std::vector<double>{0, 0, 0, 0.5, 2});
  CHECK(values(clamp_max(x, 0)) == std::vector<double>{-2, -0.5, 0, 0, 0});
  CHECK(values(clamp(x, 1, -1)) == std::vector<double>(5, -1));  // min > max: all max
  KILN_CHECK_EQUAL(clamp(strided_copy(x.view({1, 5})), -1, 1), clamp(x.view({1, 5}), -1, 1));
  KILN_CHECK_EQUAL(clamp(x.view({5, 1}).t(), -1, 1), clamp(x, -1, 1).view({1, 5}));
  const Tensor i = from_vector<int32_t>({-3, 0, 3});
  CHECK(clamp(i, -1, 1).dtype() == DType::i32);
  CHECK(values(clamp(i, -1, 1)) == std::vector<double>{-1, 0, 1});
  CHECK(clamp(i, 0.5, std::nullopt).dtype() == DType::f32);  // a float bound makes it float
  CHECK(values(clamp(i, 0.5, std::nullopt)) == std::vector<double>{0.5, 0.5, 3});
  CHECK(clamp(i, std::nullopt, 2.5).dtype() == DType::f32);
  const Tensor h = x.to(DType::f16);
  CHECK(clamp(h, 0, 1.5).dtype() == DType::f16);
  CHECK(values(clamp(h, 0, 1.5)) == std::vector<double>{0, 0, 0, 0.5, 1.5});
  CHECK(values(clamp(from_vector<uint8_t>({0, 100, 200}), 10, 150)) ==
        std::vector<double>{10, 100, 150});
  CHECK_THROWS_WITH(clamp(x, std::nullopt, std::nullopt),
                    Catch::Contains("clamp: at least one of min and max"));
  // As in PyTorch, integer bounds promote a bool tensor to i64; bool bounds keep it bool,
  // which clamp does not support.
  const Tensor b = from_vector<bool>({true, false});
  CHECK(clamp(b, 0, 1).dtype() == DType::i64);
  CHECK(values(clamp(b, 0, 1)) == std::vector<double>{1, 0});
  CHECK_THROWS_WITH(clamp(b, false, true),
                    Catch::Contains("clamp: bool tensors are not supported"));
  Tensor bi = b.clone();
  CHECK_THROWS_WITH(clamp_(bi, 0, 1), Catch::Contains("can't be cast"));
}

TEST_CASE("gelu both forms and softplus's threshold", "[elementwise]") {
  const Tensor x = from_vector<double>({-3, -1, 0, 1, 3});
  // Reference values: x * Phi(x), and the tanh approximation, in double.
  KILN_CHECK_CLOSE(
      gelu(x), from_vector<double>({-0.0040496941, -0.1586552539, 0, 0.8413447461, 2.9959503059}),
      0, 1e-9);
  KILN_CHECK_CLOSE(
      gelu(x, "tanh"),
      from_vector<double>({-0.0036373921, -0.1588080094, 0, 0.8411919906, 2.9963626079}), 0, 1e-9);
  CHECK(std::fabs(gelu(x).data_ptr<double>()[3] - gelu(x, "tanh").data_ptr<double>()[3]) > 1e-4);
  // softplus(x, beta, threshold) = log(1 + exp(beta x)) / beta, and x itself once
  // beta x > threshold.
  const Tensor s = from_vector<double>({2, 2.5, 3, -1});
  const std::vector<double> sp = values(softplus(s, 2, 5));
  CHECK(sp[0] == Approx(std::log1p(std::exp(4.0)) / 2).epsilon(1e-12));
  CHECK(sp[1] == Approx(std::log1p(std::exp(5.0)) / 2).epsilon(1e-12));  // 5 is not above 5
  CHECK(sp[2] == 3);                                                     // linear region: exact
  CHECK(sp[3] == Approx(std::log1p(std::exp(-2.0)) / 2).epsilon(1e-12));
  const std::vector<double> big = values(softplus(f32s({100, -10, 20.5})));
  CHECK(big[0] == 100);  // no overflow of exp
  CHECK(big[1] == Approx(std::log1p(std::exp(-10.0))).epsilon(1e-5));
  CHECK(big[2] == 20.5f);
  CHECK(softplus(from_vector<int32_t>({1})).dtype() == DType::f32);
}

TEST_CASE("NaN propagates through maximum / minimum / relu and clamp", "[elementwise]") {
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    const Tensor a = f32s({NAN, 1, NAN, -1}).to(dtype), b = f32s({1, NAN, NAN, 2}).to(dtype);
    for (const Tensor& r : {maximum(a, b), minimum(a, b)}) {
      const std::vector<double> v = values(r);
      CHECK(std::isnan(v[0]));
      CHECK(std::isnan(v[1]));
      CHECK(std::isnan(v[2]));
    }
    CHECK(values(maximum(a, b))[3] == 2);
    CHECK(values(minimum(a, b))[3] == -1);
    const std::vector<double> r = values(relu(a));
    CHECK(std::isnan(r[0]));
    CHECK(r[3] == 0);
    const std::vector<double> c = values(clamp(a, 0, 0.5));
    CHECK(std::isnan(c[0]));
    CHECK(c[1] == 0.5);
    CHECK(c[3] == 0);
  }
  CHECK(values(maximum(f32s({-0.0f}), f32s({INFINITY})))[0] == INFINITY);
}

TEST_CASE("in-place ops write through strided views", "[elementwise]") {
  Tensor base = zeros({4, 6});
  Tensor odd = base.slice(1, 1, 6, 2);  // [4,3], stride 2
  odd.add_(arange(3, {.dtype = DType::f32}));
  odd.add_(ones({4, 1}), 10);  // alpha scales the other operand
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 6; ++c) {
      INFO(r << "," << c);
      CHECK(at(base, {r, c}) == (c % 2 ? 10 + (c - 1) / 2 : 0));
    }
  }
  Tensor m = arange(6, {.dtype = DType::f32}).view({2, 3});
  Tensor mt = m.t();  // in place through a transpose
  mt.mul_(f32s({1, 10}));
  CHECK(values(m) == std::vector<double>{0, 1, 2, 30, 40, 50});
  m.sub_(1).div_(2);
  CHECK(values(m) == std::vector<double>{-0.5, 0, 0.5, 14.5, 19.5, 24.5});
  Tensor y = f32s({1, 2, 3});
  y.add_(y);  // aliasing the same elements is fine
  CHECK(values(y) == std::vector<double>{2, 4, 6});
  y.mul_(0.5).div_(f32s({1, 2, 4}));
  CHECK(values(y) == std::vector<double>{1, 1, 0.75});
}

TEST_CASE("in-place unary forms equal their out-of-place ops", "[elementwise]") {
  const Tensor x = f32s({-1.5, -0.25, 0.5, 2});
  const Tensor pos = f32s({0.25, 1, 2.5, 9});
  auto same = [](Tensor t, Tensor& (*f)(Tensor&), const Tensor& expected) {
    Tensor& r = f(t);
    CHECK(r.same(t));
    KILN_CHECK_EQUAL(t, expected);
  };
  same(x.clone(), neg_, neg(x));
  same(x.clone(), exp_, exp(x));
  same(pos.clone(), sqrt_, sqrt(pos));
  same(x.clone(), tanh_, tanh(x));
  same(x.clone(), sigmoid_, sigmoid(x));
  same(x.clone(), relu_, relu(x));
  Tensor c = x.clone();
  clamp_(c, -1, 1);
  KILN_CHECK_EQUAL(c, clamp(x, -1, 1));
  Tensor p = x.clone();
  pow_(p, 2);
  KILN_CHECK_EQUAL(p, pow(x, 2));
  Tensor strided = zeros({4, 2}).select(1, 1);  // a strided target
  strided.copy_(x);
  exp_(strided);
  KILN_CHECK_CLOSE(strided, exp(x), 1e-6, 0);
  Tensor f = zeros({2});
  f.fill_(2.5).zero_();
  CHECK(values(f) == std::vector<double>{0, 0});
}

TEST_CASE("in-place dtype rules: the result must cast to the target", "[elementwise]") {
  Tensor i = from_vector<int32_t>({1, 2});
  CHECK_THROWS_WITH(
      i.add_(f32s({0.5, 0.5})),
      Catch::Contains("add: result dtype f32 can't be cast to the in-place target's dtype i32"));
  CHECK_THROWS_WITH(i.div_(2), Catch::Contains("div") && Catch::Contains("i32"));
  CHECK_THROWS_WITH(i.mul_(1.5), Catch::Contains("mul"));
  CHECK_THROWS_AS(exp_(i), Error);
  CHECK_THROWS_AS(clamp_(i, 0.5, std::nullopt), Error);
  CHECK(values(i) == std::vector<double>{1, 2});  // failed calls leave it alone
  i.add_(from_vector<int64_t>({10, 20}));         // i64 result into i32: same category, allowed
  CHECK(values(i) == std::vector<double>{11, 22});
  Tensor b = from_vector<bool>({true, false});
  CHECK_THROWS_WITH(b.add_(1), Catch::Contains("can't be cast") && Catch::Contains("bool"));
  Tensor h = f32s({1, 2}).to(DType::f16);
  h.add_(f32s({0.1f, 1e-4f}));  // f32 result rounds into f16
  CHECK(h.dtype() == DType::f16);
  CHECK(values(h) == std::vector<double>{static_cast<float>(Half(1.1f)), 2});
  h.mul_(2.5);
  CHECK(values(h)[1] == 5);
  CHECK_THROWS_WITH(
      f32s({1, 2, 3}).add_(zeros({2, 3})),
      Catch::Contains("add: result shape [2,3] does not match the in-place target f32[3]"));
}

TEST_CASE("a large broadcast over a middle dim runs on several threads", "[elementwise]") {
  const int64_t n0 = 64, n1 = 128, n2 = 160;  // 1,310,720 elements
  const Tensor a = arange(n0 * n1 * n2, {.dtype = DType::f32}).view({n0, n1, n2});
  const Tensor b = arange(n0 * n2, {.dtype = DType::f32}).view({n0, 1, n2}) * 0.5;
  const Tensor s = a + b;
  const float* ps = s.data_ptr<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t k = 0; k < n2; ++k) {
        const float expected =
            static_cast<float>((i * n1 + j) * n2 + k) + 0.5f * static_cast<float>(i * n2 + k);
        bad += ps[(i * n1 + j) * n2 + k] != expected;
      }
  CHECK(bad == 0);
  // Strided large inputs, and a transposed output order.
  const Tensor d = a.slice(2, 0, n2, 2) * b.slice(2, 1, n2, 2);
  const float* pd = d.data_ptr<float>();
  bad = 0;
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t k = 0; k < n2 / 2; ++k) {
        const float av = static_cast<float>((i * n1 + j) * n2 + 2 * k);
        const float bv = 0.5f * static_cast<float>(i * n2 + 2 * k + 1);
        bad += pd[(i * n1 + j) * (n2 / 2) + k] != av * bv;
      }
  CHECK(bad == 0);
  const Tensor t = a.transpose(0, 2).contiguous();
  const Tensor eq = a.transpose(0, 2) == t;
  REQUIRE(eq.is_contiguous());
  CHECK(std::count(eq.data_ptr<bool>(), eq.data_ptr<bool>() + eq.numel(), false) == 0);
  CHECK(at(t, {3, 2, 1}) == at(a, {1, 2, 3}));
  Tensor acc = zeros({n0, n1, n2});
  acc.add_(b);  // a large in-place broadcast
  CHECK(at(acc, {63, 127, 159}) == 0.5 * (63 * n2 + 159));
  CHECK(at(acc, {10, 77, 3}) == 0.5 * (10 * n2 + 3));
}

TEST_CASE("bad input names the op and shows shapes and dtypes", "[elementwise]") {
  CHECK_THROWS_WITH(f32s({1, 2}) * f32s({1, 2, 3}),
                    Catch::Contains("mul: shapes [2], [3] cannot be broadcast together"));
  CHECK_THROWS_WITH(maximum(zeros({2, 3}), zeros({3, 2})),
                    Catch::Contains("maximum") && Catch::Contains("[2,3], [3,2]"));
  CHECK_THROWS_WITH(logical_and(zeros({4}), zeros({5})), Catch::Contains("logical_and"));
  CHECK_THROWS_WITH(neg(from_vector<bool>({true}, {1})),
                    Catch::Contains("neg: bool tensors are not supported (bool[1] cpu)"));
  CHECK_THROWS_WITH(gelu(zeros({2}), "erf"),
                    Catch::Contains("gelu: approximate must be \"none\" or \"tanh\""));
  CHECK_THROWS_AS(add(Tensor(), zeros({2})), Error);
}

namespace {

// The largest error of a float function over every 4099th bit pattern (finite inputs), in
// ulps of the float nearest the double reference; `at` gets the worst input.
template <class F, class R> double worst_ulp(F f, R reference, float& at) {
  double worst = 0;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const auto b = static_cast<uint32_t>(bits);
    float x;
    std::memcpy(&x, &b, sizeof x);
    if (!std::isfinite(x)) continue;
    const double want = reference(static_cast<double>(x));
    const float nearest = static_cast<float>(want);
    const double ulp = nearest == 0 ? std::numeric_limits<float>::denorm_min()
                                    : std::nextafter(std::fabs(nearest), INFINITY) - std::fabs(nearest);
    const double error = std::fabs(static_cast<double>(f(x)) - want) / ulp;
    if (error > worst) {
      worst = error;
      at = x;
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("erf in f32 is within 1.2 ulp of the exact value", "[elementwise]") {
  // kernels/scalar.h computes it branch-free with two polynomials (so loops vectorize);
  // checked once over all 2^32 floats at 1.17 ulp, here over every 4099th bit pattern.
  float worst_x = 0;
  const double worst = worst_ulp([](float x) { return scalar::erf(x); }, [](double x) { return std::erf(x); }, worst_x);
  INFO("worst at " << worst_x);
  CHECK(worst <= 1.2);
  // Odd, exactly +-1 beyond 3.92 and at infinity, NaN kept, the region boundary continuous.
  for (float x : {1e-30f, 0.3f, 0.999f, 1.0f, 2.5f, 3.9f})
    CHECK(scalar::erf(-x) == -scalar::erf(x));
  CHECK(scalar::erf(3.93f) == 1.0f);
  CHECK(scalar::erf(std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(scalar::erf(-std::numeric_limits<float>::infinity()) == -1.0f);
  CHECK(std::isnan(scalar::erf(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::signbit(scalar::erf(-0.0f)));
  CHECK(std::fabs(scalar::erf(std::nextafter(1.0f, 0.0f)) - scalar::erf(1.0f)) < 2e-7);
  // gelu's eager kernel runs the same function.
  const Tensor x = f32s({-2.0f, -0.5f, 0.0f, 0.7f, 1.5f});
  const std::vector<double> got = values(gelu(x)), in = values(x);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == scalar::gelu(static_cast<float>(in[i]), false));
}

TEST_CASE("tanh in f32 is within 1.75 ulp of the exact value", "[elementwise]") {
  // Branch-free in kernels/scalar.h (a series below 0.625, e^(-2|x|) above); checked once
  // over all 2^32 floats at 1.75 ulp, here over every 4099th bit pattern.
  float worst_x = 0;
  const double worst = worst_ulp([](float x) { return scalar::tanh(x); }, [](double x) { return std::tanh(x); }, worst_x);
  INFO("worst at " << worst_x);
  CHECK(worst <= 1.75);
  // Odd, +-1 far out and at infinity, NaN kept, -0 kept, the region boundary continuous.
  for (float x : {1e-30f, 0.3f, 0.624f, 0.625f, 2.5f, 9.0f, 50.0f})
    CHECK(scalar::tanh(-x) == -scalar::tanh(x));
  CHECK(scalar::tanh(10.0f) == 1.0f);
  CHECK(scalar::tanh(std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(scalar::tanh(-std::numeric_limits<float>::infinity()) == -1.0f);
  CHECK(std::isnan(scalar::tanh(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::signbit(scalar::tanh(-0.0f)));
  CHECK(std::fabs(scalar::tanh(std::nextafter(0.625f, 0.0f)) - scalar::tanh(0.625f)) < 2e-7);
  // The tanh op and the tanh-form GELU run the same function.
  const Tensor x = f32s({-2.0f, -0.5f, 0.0f, 0.7f, 1.5f});
  const std::vector<double> t = values(tanh(x)), g = values(gelu(x, "tanh")), in = values(x);
  for (size_t i = 0; i < t.size(); ++i) {
    CHECK(t[i] == scalar::tanh(static_cast<float>(in[i])));
    CHECK(g[i] == scalar::gelu(static_cast<float>(in[i]), true));
  }
}
