#pragma once
// exp for f32 loops that the compiler vectorizes: straight-line arithmetic and selects, no
// call, so a loop over it becomes SSE2 (or, built under KILN_WIDE_LOOP, AVX-512) code where
// a loop over expf stays one libm call per element (softmax over a 30,522-word vocabulary:
// 5 ns an element).
#include <bit>
#include <cstdint>
#include <limits>

namespace kiln::cpu {

// exp(x) for x <= 88.376 (2^127.5), within 2 ulp of the true value (Cephes' expf
// polynomial after reducing by n ln 2 with ln 2 in two parts); 0 below -87.336, where exp
// leaves f32's normal range (denormal results flush to 0; -inf gives 0); +inf above 88.376
// (short of f32's 88.723: the softmax and attention kernels call it on x - max <= 0); NaN
// for NaN. The same bits in the plain and the AVX-512 build: no operation contracts (the
// wide build turns fp-contract off) and every step rounds the same way.
__attribute__((always_inline)) inline float exp_f32(float x) {
  constexpr float kLow = -87.33654f, kHigh = 88.37626f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: x + kRound rounds x to an integer
  const float c = x < kLow ? kLow : (x > kHigh ? kHigh : x);  // NaN stays NaN
  const float t = c * kLog2e + kRound;
  const float n = t - kRound;  // round(c log2 e), in [-126, 127]
  const float r = (c - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n from n's bits: t's low mantissa bits hold n + 2^22 (kRound's).
  const uint32_t n_bits = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound);
  const float scale = std::bit_cast<float>((n_bits + 127u) << 23);
  const float y = p * scale;
  return x < kLow ? 0.0f : (x > kHigh ? std::numeric_limits<float>::infinity() : y);
}

}  // namespace kiln::cpu
