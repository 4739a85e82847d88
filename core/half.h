#pragma once
// 16-bit floating types: storage only; arithmetic happens in f32. Conversions round to
// nearest even. Written with plain integer types so that NVRTC compiles this header too.
#include "core/hd.h"
#if !defined(__CUDACC_RTC__)
#include <cstring>
#endif

namespace kiln {

KILN_HD unsigned int f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

KILN_HD float bits_to_f32(unsigned int u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

KILN_HD unsigned short f32_to_f16_bits(float f) {
  unsigned int x = f32_to_bits(f);
  const unsigned int sign = x & 0x80000000u;
  x ^= sign;
  unsigned int out;
  if (x >= (143u << 23)) {                // >= 2^16, inf or nan: saturate to inf, keep nan
    out = x > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (x < (113u << 23)) {          // below 2^-14: a subnormal half (or zero)
    // Adding 0.5 shifts the mantissa so the float adder rounds it to nearest even for us.
    const unsigned int magic = 126u << 23;
    out = f32_to_bits(bits_to_f32(x) + bits_to_f32(magic)) - magic;
  } else {
    const unsigned int mant_odd = (x >> 13) & 1u;
    x += (static_cast<unsigned int>(15 - 127) << 23) + 0xfffu;  // rebias, round half up
    x += mant_odd;                                               // ... ties to even
    out = x >> 13;
  }
  return static_cast<unsigned short>(out | (sign >> 16));
}

KILN_HD float f16_bits_to_f32(unsigned short h) {
  const unsigned int sign = static_cast<unsigned int>(h & 0x8000u) << 16;
  const unsigned int em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_to_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return bits_to_f32(sign | ((em << 13) + (112u << 23)));
  const float sub = static_cast<float>(em) * 5.9604644775390625e-08f;  // em * 2^-24
  return sign ? -sub : sub;
}

KILN_HD unsigned short f32_to_bf16_bits(float f) {
  const unsigned int x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  const unsigned int rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>((x + rounding) >> 16);
}

KILN_HD float bf16_bits_to_f32(unsigned short b) {
  return bits_to_f32(static_cast<unsigned int>(b) << 16);
}

struct Half {
  unsigned short bits;
  Half() = default;
  KILN_HD Half(float f) : bits(f32_to_f16_bits(f)) {}
  KILN_HD operator float() const { return f16_bits_to_f32(bits); }
  KILN_HD static Half from_bits(unsigned short b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  unsigned short bits;
  BFloat16() = default;
  KILN_HD BFloat16(float f) : bits(f32_to_bf16_bits(f)) {}
  KILN_HD operator float() const { return bf16_bits_to_f32(bits); }
  KILN_HD static BFloat16 from_bits(unsigned short b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace kiln
