#pragma once
// Tolerances derived from the arithmetic, for results that two implementations sum in
// different orders: OpenBLAS picks its GEMM kernels per CPU (so its order differs between
// users' machines), generated loops sum in their own order, NHWC kernels in another.
//
// Any order of summing n terms in a floating type with unit roundoff u is within
// gamma(n) = n u / (1 - n u) of the exact sum, relative to the sum of the terms' magnitudes
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4); two orders
// are within twice that of each other. A test names its longest sum and uses
// summation_bound(n) instead of a figure that happened to pass with one machine's kernels.
#include <cmath>
#include <cstdint>

#include "testing.h"

namespace kiln::testing {

inline constexpr double kF32Roundoff = 0x1p-24;
inline constexpr double kF64Roundoff = 0x1p-53;

// gamma(n) for unit roundoff u.
constexpr double sum_error_bound(int64_t n, double u = kF32Roundoff) {
  const double nu = static_cast<double>(n) * u;
  return nu / (1 - nu);
}

// The largest relative difference between two summation orders of the same n terms.
constexpr double summation_bound(int64_t n, double u = kF32Roundoff) { return 2 * sum_error_bound(n, u); }

// ||actual - expected||_2 <= rtol ||expected||_2 (shapes equal): the normwise form in which
// a summation bound speaks. Elementwise, an entry near zero (a bias that barely moved, a
// weight gradient that cancels) can differ by more than its own size.
inline bool norm_close(const Tensor& actual, const Tensor& expected, double rtol) {
  if (actual.shape() != expected.shape()) return false;
  const std::vector<double> a = values(actual), e = values(expected);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    norm += e[i] * e[i];
  }
  return std::sqrt(diff) <= rtol * std::sqrt(norm);
}

}  // namespace kiln::testing

#define KILN_CHECK_NORM_CLOSE(actual, expected, rtol)                    \
  do {                                                                   \
    const ::kiln::Tensor kiln_a_ = (actual), kiln_e_ = (expected);       \
    INFO("actual:   " << ::kiln::testing::describe(kiln_a_));            \
    INFO("expected: " << ::kiln::testing::describe(kiln_e_));            \
    CHECK(::kiln::testing::norm_close(kiln_a_, kiln_e_, (rtol)));        \
  } while (0)
