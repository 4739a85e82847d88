#pragma once
// Shared by the CUDA tests: the ones that need a GPU return early, with a warning that says
// why, on machines without one (Catch2 2 has no SKIP).
#include "testing.h"

#define KILN_NEEDS_GPU()                                                           \
  do {                                                                             \
    if (!::kiln::cuda::is_available()) {                                           \
      WARN("skipped, it needs a GPU: " << ::kiln::cuda::unavailable_reason());     \
      return;                                                                      \
    }                                                                              \
  } while (0)
