// The switch between the plain and the AVX-512 builds of the 16-bit elementwise loops.
#include "kernels/cpu/wide.h"

#include <atomic>

#include "core/error.h"

namespace kiln::cpu {
namespace {

bool detect_avx512() {
  __builtin_cpu_init();
  // GCC's check of an AVX-512 feature includes the OS's saving of the zmm registers.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

const bool g_has_avx512 = detect_avx512();
std::atomic<bool> g_wide{g_has_avx512};

}  // namespace

bool wide_loops() { return g_wide.load(std::memory_order_relaxed); }

void set_wide_loops(bool on) {
  KILN_CHECK(!on || g_has_avx512, "set_wide_loops: this CPU has no AVX-512 (F, BW, VL, DQ)");
  g_wide.store(on, std::memory_order_relaxed);
}

}  // namespace kiln::cpu
