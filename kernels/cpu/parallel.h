#pragma once
// parallel_for: splits [0, n) into one contiguous range per OpenMP thread when the work is
// large enough to pay for the threads.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace kiln::cpu {

inline constexpr int64_t kGrain = 32768;  // elements below which one thread does all

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (n <= grain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t max_threads = std::min<int64_t>(omp_get_max_threads(), (n + grain - 1) / grain);
#pragma omp parallel num_threads(static_cast<int>(max_threads))
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) f(begin, end);
  }
}

}  // namespace kiln::cpu
