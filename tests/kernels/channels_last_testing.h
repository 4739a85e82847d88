#pragma once
// Helpers the channels-last kernel tests share: random inputs, NHWC copies, and the check
// that NHWC results equal the contiguous ones to testing::tol(dtype).
#include "testing.h"

namespace kiln::testing {

inline constexpr MemoryFormat kNhwc = MemoryFormat::channels_last;

inline Tensor random_of(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, {.dtype = dtype}, &gen);
}

// A channels_last copy of t, checked to be one.
inline Tensor nhwc(const Tensor& t) {
  Tensor c = t.contiguous(kNhwc);
  REQUIRE(c.suggest_memory_format() == kNhwc);
  return c;
}

inline bool is_nhwc(const Tensor& t) { return t.suggest_memory_format() == kNhwc; }

}  // namespace kiln::testing

#define CHECK_SAME_VALUES(actual, expected, dtype) \
  KILN_CHECK_CLOSE(actual, expected, ::kiln::testing::tol(dtype), ::kiln::testing::tol(dtype))
