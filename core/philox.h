#pragma once
// Philox4x32-10, the counter-based generator (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11). kiln's random stream is defined element by element: element i
// of a random op called with (seed, offset) uses the counter offset + i, so the CPU loops
// and CUDA threads produce the identical stream in any order. This header compiles for the
// host and for the device (it has no includes).
#include "core/hd.h"
#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

namespace kiln::philox {

struct Block {
  unsigned int v[4];
};

KILN_HD unsigned int mulhilo(unsigned int a, unsigned int b, unsigned int* hi) {
  const unsigned long long p = static_cast<unsigned long long>(a) * b;
  *hi = static_cast<unsigned int>(p >> 32);
  return static_cast<unsigned int>(p);
}

// Four 32-bit random words for a 64-bit counter under a 64-bit key.
KILN_HD Block random4(unsigned long long seed, unsigned long long counter) {
  unsigned int c0 = static_cast<unsigned int>(counter), c1 = static_cast<unsigned int>(counter >> 32);
  unsigned int c2 = 0, c3 = 0;
  unsigned int k0 = static_cast<unsigned int>(seed), k1 = static_cast<unsigned int>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    unsigned int hi0, hi1;
    const unsigned int lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const unsigned int lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Uniform in [0, 1): 24 random bits for float, 53 for double.
KILN_HD float uniform_f32(const Block& b) { return static_cast<float>(b.v[0] >> 8) * 5.9604644775390625e-08f; }
KILN_HD double uniform_f64(const Block& b) {
  const unsigned long long bits =
      (static_cast<unsigned long long>(b.v[0]) << 21) ^ (static_cast<unsigned long long>(b.v[1]) >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 1.1102230246251565e-16;
}
// Uniform in [0, 1) on `digits` random bits, for the 16-bit floats (11 for f16, 8 for
// bf16, as PyTorch does): a 24-bit uniform would round up to 1 when stored in them.
KILN_HD float uniform_digits(const Block& b, int digits) {
  return static_cast<float>(b.v[0] >> (32 - digits)) / static_cast<float>(1u << digits);
}
// Uniform in (0, 1]: safe to take the log of.
KILN_HD float open_uniform_f32(unsigned int w) { return (static_cast<float>(w >> 8) + 1.0f) * 5.9604644775390625e-08f; }
KILN_HD double open_uniform_f64(unsigned int hi, unsigned int lo) {
  const unsigned long long bits =
      ((static_cast<unsigned long long>(hi) << 21) ^ (static_cast<unsigned long long>(lo) >> 11)) & ((1ull << 53) - 1);
  return (static_cast<double>(bits) + 1.0) * 1.1102230246251565e-16;
}

// Standard normal by Box-Muller.
KILN_HD float normal_f32(const Block& b) {
  const float u1 = open_uniform_f32(b.v[0]), u2 = static_cast<float>(b.v[1] >> 8) * 5.9604644775390625e-08f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}
KILN_HD double normal_f64(const Block& b) {
  const double u1 = open_uniform_f64(b.v[0], b.v[1]);
  const double u2 = uniform_f64(Block{{b.v[2], b.v[3], 0, 0}});
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}

// Dropout's rule (core/ops/dropout.h): element i is kept when its uniform is >= p.
KILN_HD bool dropout_keep(unsigned long long seed, unsigned long long offset, unsigned long long i,
                          float p) {
  return uniform_f32(random4(seed, offset + i)) >= p;
}

// 64 random bits, for integers.
KILN_HD unsigned long long bits64(const Block& b) {
  return (static_cast<unsigned long long>(b.v[0]) << 32) | b.v[1];
}

}  // namespace kiln::philox
