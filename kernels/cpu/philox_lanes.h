#pragma once
// Philox4x32-10 (core/philox.h) for kPhiloxLanes consecutive counters at once: dropout's
// keep test for a run of elements. Where the CPU has AVX-512 the 16 lanes' rounds run in
// vector registers (vpmuludq for the 32 x 32 -> 64-bit products; GCC leaves the plain
// lane loop scalar); elsewhere a loop over lanes. The same words bit for bit (integer
// arithmetic); tests check them against philox::random4.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/wide.h"

namespace kiln::cpu {

inline constexpr int64_t kPhiloxLanes = 16;

// The first word of philox::random4(seed, counter0 + j) for j < kPhiloxLanes.
__attribute__((always_inline)) inline void philox_first_words(uint64_t seed, uint64_t counter0,
                                                              uint32_t (&words)[kPhiloxLanes]) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  for (int64_t j = 0; j < kPhiloxLanes; ++j) {
    const uint64_t counter = counter0 + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(counter);
    c1[j] = static_cast<uint32_t>(counter >> 32);
    c2[j] = 0;
    c3[j] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int64_t j = 0; j < kPhiloxLanes; ++j) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c0[j], p1 = uint64_t{0xCD9E8D57u} * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c0[j] = n0;
      c1[j] = static_cast<uint32_t>(p1);
      c2[j] = n2;
      c3[j] = static_cast<uint32_t>(p0);
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int64_t j = 0; j < kPhiloxLanes; ++j) words[j] = c0[j];
}

// The 32 x 32 -> 64-bit products of a's 16 lanes with m's: their low and high halves, in
// lane order.
__attribute__((always_inline, target("avx512f"))) inline void product_halves(__m512i a, __m512i m, __m512i& low,
                                                                            __m512i& high) {
  constexpr __mmask16 kOdd = 0xAAAA;
  const __m512i even = _mm512_mul_epu32(a, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  low = _mm512_mask_blend_epi32(kOdd, even, _mm512_slli_epi64(odd, 32));
  high = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even, 32), odd);
}

// philox_first_words with AVX-512F intrinsics: the 16 lanes' words in four registers;
// _mm512_mul_epu32 multiplies the even lanes, so the odd ones go shifted down, and the
// products' low and high halves are blended back into lane order.
__attribute__((always_inline, target("avx512f"))) inline void philox_first_words_avx512(
    uint64_t seed, uint64_t counter0, uint32_t (&words)[kPhiloxLanes]) {
  alignas(64) uint32_t lo[kPhiloxLanes], hi[kPhiloxLanes];
  for (int64_t j = 0; j < kPhiloxLanes; ++j) {
    const uint64_t counter = counter0 + static_cast<uint64_t>(j);
    lo[j] = static_cast<uint32_t>(counter);
    hi[j] = static_cast<uint32_t>(counter >> 32);
  }
  __m512i c0 = _mm512_load_si512(lo), c1 = _mm512_load_si512(hi);
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m512i lo0, hi0, lo1, hi1;
    product_halves(c0, m0, lo0, hi0);
    product_halves(c2, m1, lo1, hi1);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  _mm512_storeu_si512(words, c0);
}

// philox::dropout_keep(seed, offset, i, p) for i = first + j, j < n (any n), as `kept`
// (keep ? kept : dropped) into out[j]; the 16-lane words from `words_of`.
template <class T, class Words>
__attribute__((always_inline)) inline void dropout_keep_run(uint64_t seed, uint64_t offset, uint64_t first,
                                                            int64_t n, float p, T kept, T dropped, T* out,
                                                            Words words_of) {
  uint32_t words[kPhiloxLanes];
  for (int64_t j0 = 0; j0 < n; j0 += kPhiloxLanes) {
    words_of(seed, offset + first + static_cast<uint64_t>(j0), words);
    const int64_t m = n - j0 < kPhiloxLanes ? n - j0 : kPhiloxLanes;
    // uniform_f32: 24 random bits scaled to [0, 1).
    for (int64_t j = 0; j < m; ++j)
      out[j0 + j] = static_cast<float>(words[j] >> 8) * 5.9604644775390625e-08f >= p ? kept : dropped;
  }
}

// dropout_keep_run with the AVX-512 rounds, built for AVX-512 (the loop written out: GCC
// inlines bottom-up, so an always_inline callee cannot take the target from its caller).
template <class T>
KILN_WIDE_LOOP void dropout_keep_run_wide(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, float p,
                                          T kept, T dropped, T* out) {
  uint32_t words[kPhiloxLanes];
  for (int64_t j0 = 0; j0 < n; j0 += kPhiloxLanes) {
    philox_first_words_avx512(seed, offset + first + static_cast<uint64_t>(j0), words);
    const int64_t m = n - j0 < kPhiloxLanes ? n - j0 : kPhiloxLanes;
    for (int64_t j = 0; j < m; ++j)
      out[j0 + j] = static_cast<float>(words[j] >> 8) * 5.9604644775390625e-08f >= p ? kept : dropped;
  }
}

// dropout_keep_run with the AVX-512 rounds where wide_loops() says so, else with the plain
// lane loop: the same values.
template <class T>
void dropout_keep_values(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, float p, T kept, T dropped,
                         T* out) {
  if (wide_loops()) return dropout_keep_run_wide<T>(seed, offset, first, n, p, kept, dropped, out);
  dropout_keep_run(seed, offset, first, n, p, kept, dropped, out,
                   [](uint64_t s, uint64_t c, uint32_t(&w)[kPhiloxLanes]) __attribute__((always_inline)) {
                     philox_first_words(s, c, w);
                   });
}

}  // namespace kiln::cpu
