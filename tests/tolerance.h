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
#include <map>
#include <string>
#include <vector>

#include "testing.h"

namespace kiln::testing {

inline constexpr double kF32Roundoff = 0x1p-24;

// gamma(n) for unit roundoff u.
constexpr double sum_error_bound(int64_t n, double u = kF32Roundoff) {
  const double nu = static_cast<double>(n) * u;
  return nu / (1 - nu);
}

// The largest relative difference between two summation orders of the same n terms.
constexpr double summation_bound(int64_t n, double u = kF32Roundoff) { return 2 * sum_error_bound(n, u); }

// ||actual - expected||_2 / ||expected||_2 of two sets of named tensors (a model's weights
// and buffers), taken as one vector: the normwise form in which a summation bound speaks.
// Per tensor the bound would not hold: a parameter whose gradient is a cancelling sum (a
// batch norm's shift, whose gradient adds dL/dy of both signs over the batch) moves by
// amounts bounded by the terms' magnitudes, which can exceed its own size. Names or shapes
// that differ give infinity.
inline double relative_difference(const std::map<std::string, Tensor>& actual,
                                  const std::map<std::string, Tensor>& expected) {
  if (actual.size() != expected.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (const auto& [name, e] : expected) {
    const auto it = actual.find(name);
    if (it == actual.end() || it->second.shape() != e.shape()) return INFINITY;
    const std::vector<double> va = values(it->second), ve = values(e);
    for (size_t i = 0; i < va.size(); ++i) {
      diff += (va[i] - ve[i]) * (va[i] - ve[i]);
      norm += ve[i] * ve[i];
    }
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

}  // namespace kiln::testing
