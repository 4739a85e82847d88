#pragma once
// The AVX-512 build of the 16-bit elementwise loops: the switch and the function attribute.
#include <type_traits>

#include "core/half.h"

namespace kiln::cpu {

// Whether the contiguous loops of maps with a 16-bit float operand run their AVX-512 build
// (F, BW, VL, DQ): detected once; set_wide_loops(false) forces the plain build (SSE2 here),
// which tests use to check both give the same bits. Turning it on needs the CPU's support.
bool wide_loops();
void set_wide_loops(bool on);

template <class T>
inline constexpr bool is_16bit_float = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The AVX-512 build of a loop. A 16-bit loop converts every element (integer shifts, adds
// and masks), which at SSE2's 4 lanes cost 3-4x f32's time per element; 16 lanes make it
// as fast as the memory. fp-contract=off: AVX-512 brings FMA, and a contracted a * b + c
// would round differently from the plain build and from f32.
#define KILN_WIDE_LOOP \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), optimize("fp-contract=off")))

// f() built into a KILN_WIDE_LOOP function. f must be a lambda marked
// `__attribute__((always_inline))` whose loops call only always_inline helpers, so that
// all of it is compiled inside, for AVX-512.
template <class F>
KILN_WIDE_LOOP void call_wide(F& f) {
  f();
}

// f() in the AVX-512 build when T is a 16-bit float and wide_loops() says so, else plainly:
// the same operations in the same order either way, so the same bits.
template <class T, class F>
void with_wide(F&& f) {
  if constexpr (is_16bit_float<T>)
    if (wide_loops()) return call_wide(f);
  f();
}

}  // namespace kiln::cpu
