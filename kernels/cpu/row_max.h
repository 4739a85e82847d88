#pragma once
// The largest element of a contiguous row, over kLanes independent lanes so that the loop
// vectorizes (SSE2, or AVX-512 inside a KILN_WIDE_LOOP function): the softmax kernels' and
// linear_cross_entropy's first pass. A NaN never wins (comparisons with it are false), so a
// row's NaN shows in its sum of exponentials instead; -inf for an empty row.
#include <cstdint>
#include <limits>

namespace kiln::cpu {

template <class T, int64_t kLanes = 16>
__attribute__((always_inline)) inline T row_max(const T* x, int64_t n) {
  T lane_max[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lane_max[j] = -std::numeric_limits<T>::infinity();
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane_max[j] = x[k + j] > lane_max[j] ? x[k + j] : lane_max[j];
  for (; k < n; ++k) lane_max[0] = x[k] > lane_max[0] ? x[k] : lane_max[0];
  T max = lane_max[0];
  for (int64_t j = 1; j < kLanes; ++j) max = lane_max[j] > max ? lane_max[j] : max;
  return max;
}

}  // namespace kiln::cpu
