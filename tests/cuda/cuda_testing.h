#pragma once
// Shared by the CUDA tests: moving tensors between devices, reproducible inputs, whether an
// op fell back to the host, and an early return, with a warning that says why, for tests
// that need a GPU on machines without one (Catch2 2 has no SKIP).
#include <algorithm>
#include <string>
#include <vector>

#include "core/cuda.h"
#include "testing.h"

namespace kiln::testing {

inline Tensor gpu(const Tensor& t) { return t.to(Device::cuda()); }
inline Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

// Whether `op` has run on the CUDA host fallback in this process (cuda::host_fallback_ops).
inline bool on_host_fallback(const std::string& op) {
  const std::vector<std::string> used = cuda::host_fallback_ops();
  return std::find(used.begin(), used.end(), op) != used.end();
}

// Values in (lo, hi) of `dtype`, a fixed pseudo-random pattern of `seed`.
inline Tensor values_in(Shape shape, double lo, double hi, DType dtype, uint64_t seed = 3) {
  Generator g(seed);
  return (rand(shape, {.dtype = DType::f64}, &g) * (hi - lo) + lo).to(dtype);
}

}  // namespace kiln::testing

#define KILN_NEEDS_GPU()                                                           \
  do {                                                                             \
    if (!::kiln::cuda::is_available()) {                                           \
      WARN("skipped, it needs a GPU: " << ::kiln::cuda::unavailable_reason());     \
      return;                                                                      \
    }                                                                              \
  } while (0)
