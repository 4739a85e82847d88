// gelu_backward(grad, x): grad times gelu's slope, against the derivative written out in
// double, in both forms and every floating dtype, on contiguous, strided and broadcast
// operands; its promotion and its errors; the branch-free f32 exp it computes phi with.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>

#include "kernels/scalar.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Points on both sides of 0: tiny ones (where gelu(x) / x lost precision), the slope's zero
// near -0.75, erf's regions (|x / sqrt 2| < 1, < 3.92, beyond) and tails where exp
// underflows.
const std::vector<double> kX = {0,    1e-30, -1e-6, 3e-4, -0.75, 0.5, -1.2, 1.7,  -2.5, 3.1,
                                -4.2, 5.6,   -6.5,  8,    -10,   12,  -40,  40,   0.3,  -0.1};
const std::vector<double> kGrad = {1.5, -0.25, 3, 1, -2, 0.75, 1.25, -1, 2.5, 0.5};

struct Slope {
  double value;  // gelu'(x)
  double scale;  // the sum of the magnitudes of the terms the slope adds, for the tolerance
};

// gelu'(x) in double. Exact: Phi(x) + x phi(x). Tanh form: (1 + t) / 2 + x (1 - t^2) u' / 2
// with t = tanh(k (x + a x^3)) and u' = k (1 + 3 a x^2).
Slope slope(double x, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2 / std::numbers::pi), a = 0.044715;
    const double t = std::tanh(k * (x + a * x * x * x)), du = k * (1 + 3 * a * x * x);
    const double first = 0.5 * (1 + t), second = 0.5 * x * (1 - t * t) * du;
    // t's rounding error (a few ulps, and the error of u) enters the second term through
    // 1 - t^2 scaled by |x| u', which is not small where t is near 1.
    return {first + second, std::fabs(first) + std::fabs(second) + std::fabs(x) * du + 1};
  }
  const double cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
  const double pdf = std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi);
  // exp's argument -x^2/2 carries a relative rounding error, which becomes x^2/2 relative
  // error of phi: the second term's share grows with x^2.
  return {cdf + x * pdf, 1 + std::fabs(x * pdf) * (1 + x * x / 2)};
}

// The unit roundoff of the type the op computes in (f32 for the 16-bit types), and of the
// stored result.
double compute_eps(DType dt) { return dt == DType::f64 ? 0x1p-53 : 0x1p-24; }
double storage_eps(DType dt) {
  switch (dt) {
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    default: return compute_eps(dt);
  }
}

// Checks gelu_backward(grad, x) element by element against the double slope of the stored
// x times the stored grad. The bound: about 16 roundings of the compute type on each term
// (erf and exp are within ~1 ulp, the rest are single roundings; 16 leaves room for the
// chain of them), plus the rounding of the result to its storage type.
void check_against_reference(const Tensor& got, const Tensor& grad, const Tensor& x, bool tanh_form) {
  const Tensor g = grad.expand(x.shape());
  const std::vector<double> out = values(got), gv = values(g), xv = values(x);
  REQUIRE(out.size() == xv.size());
  const DType dt = got.dtype();
  for (size_t i = 0; i < out.size(); ++i) {
    const Slope s = slope(xv[i], tanh_form);
    const double want = gv[i] * s.value;
    const double bound = 16 * compute_eps(dt) * std::fabs(gv[i]) * s.scale + storage_eps(dt) * std::fabs(want);
    INFO(name(dt) << (tanh_form ? " tanh" : " exact") << " x = " << xv[i] << " grad = " << gv[i] << " got "
                  << out[i] << " want " << want << " bound " << bound);
    CHECK(std::fabs(out[i] - want) <= bound);
  }
}

Tensor grads_for(size_t n, DType dt) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = kGrad[i % kGrad.size()];
  return tensor_of(g, {}, dt);
}

}  // namespace

TEST_CASE("gelu_backward equals grad times gelu's slope in every floating dtype", "[elementwise][gelu]") {
  for (const bool tanh_form : {false, true}) {
    const std::string form = tanh_form ? "tanh" : "none";
    for (DType dt : kFloatDTypes) {
      INFO(name(dt) << " " << form);
      const Tensor x = tensor_of(kX, {}, dt), g = grads_for(kX.size(), dt);
      const Tensor got = gelu_backward(g, x, form);
      CHECK(got.dtype() == dt);
      check_against_reference(got, g, x, tanh_form);
      // Strided operands and a broadcast grad give the same elements.
      const Tensor x2 = tensor_of(kX, {4, 5}, dt), g2 = grads_for(20, dt).view({4, 5});
      KILN_CHECK_EQUAL(gelu_backward(strided_copy(g2), transposed_copy(x2), form), gelu_backward(g2, x2, form));
      const Tensor row = grads_for(5, dt);
      check_against_reference(gelu_backward(row, x2, form), row, x2, tanh_form);
    }
  }
}

TEST_CASE("gelu_backward at 0 is grad / 2 and keeps NaN", "[elementwise][gelu]") {
  for (const char* form : {"none", "tanh"}) {
    const Tensor r = gelu_backward(f32s({3, 1, 2}), f32s({0, NAN, -0.0f}), form);
    const std::vector<double> v = values(r);
    CHECK(v[0] == 1.5);
    CHECK(std::isnan(v[1]));
    CHECK(v[2] == 1);
  }
}

TEST_CASE("gelu_backward promotes its operands and names itself in errors", "[elementwise][gelu]") {
  CHECK(gelu_backward(f32s({1}), tensor_of({1}, {}, DType::f64)).dtype() == DType::f64);
  CHECK(gelu_backward(tensor_of({1}, {}, DType::bf16), tensor_of({1}, {}, DType::bf16)).dtype() == DType::bf16);
  CHECK(gelu_backward(tensor_of({1}, {}, DType::i64), tensor_of({1}, {}, DType::i64)).dtype() == DType::f32);
  CHECK_THROWS_WITH(gelu_backward(zeros({2}), zeros({2}), "erf"),
                    Catch::Contains("gelu_backward: approximate must be \"none\" or \"tanh\""));
  CHECK_THROWS_WITH(gelu_backward(zeros({2}), zeros({3})),
                    Catch::Contains("gelu_backward") && Catch::Contains("[2], [3]"));
}

TEST_CASE("exp_nonpositive in f32 is within 1.25 ulp of the exact value", "[elementwise][gelu]") {
  // Checked once over every float in [-87.33, 0] at 1.22 ulp; here every 257th one.
  double worst = 0;
  float worst_x = 0;
  for (uint32_t bits = 0x80000000u; bits < 0xC2AEA8F6u; bits += 257) {  // -0 to -87.33
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const double want = std::exp(static_cast<double>(x));
    const float nearest = static_cast<float>(want);
    if (nearest < std::numeric_limits<float>::min()) continue;  // subnormal: flushed to 0
    const double ulp = std::nextafter(nearest, INFINITY) - nearest;
    const double error = std::fabs(static_cast<double>(scalar::exp_nonpositive(x)) - want) / ulp;
    if (error > worst) {
      worst = error;
      worst_x = x;
    }
  }
  INFO("worst at " << worst_x);
  CHECK(worst <= 1.25);
  CHECK(scalar::exp_nonpositive(0.0f) == 1.0f);
  CHECK(scalar::exp_nonpositive(-0.0f) == 1.0f);
  CHECK(scalar::exp_nonpositive(-88.0f) == 0.0f);
  CHECK(scalar::exp_nonpositive(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(scalar::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}
