#pragma once
// 16-bit floating types: storage only; arithmetic happens in f32. Conversions round to
// nearest even. Written with plain integer types so that NVRTC compiles this header too.
#include "core/hd.h"
#if !defined(__CUDACC_RTC__)
#include <cstring>
#endif

// The conversions are always inlined: a call per element (which GCC chose for the larger
// f16 ones) keeps a loop over them from vectorizing.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_HD_CONVERSION __host__ __device__ __forceinline__
#else
#define KILN_HD_CONVERSION [[gnu::always_inline]] inline
#endif

namespace kiln {

KILN_HD_CONVERSION unsigned int f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

KILN_HD_CONVERSION float bits_to_f32(unsigned int u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The conversions are branch-free: every case is computed and the result picked with bit
// masks, so a loop over them vectorizes with plain integer ops (a branch per element kept
// GCC from vectorizing the f16 ones and made the bf16 ones slow).

// All ones when `c`, else zero.
KILN_HD_CONVERSION unsigned int mask_if(bool c) { return 0u - static_cast<unsigned int>(c); }

// a where `mask` is all ones, b where it is zero.
KILN_HD_CONVERSION unsigned int select_bits(unsigned int mask, unsigned int a, unsigned int b) {
  return (a & mask) | (b & ~mask);
}

KILN_HD_CONVERSION unsigned short f32_to_f16_bits(float f) {
  unsigned int x = f32_to_bits(f);
  const unsigned int sign = x & 0x80000000u;
  x ^= sign;
  // >= 2^16, inf or nan: saturate to inf, keep nan (as a quiet nan without payload)
  const unsigned int huge = select_bits(mask_if(x > (255u << 23)), 0x7e00u, 0x7c00u);
  // below 2^-14: a subnormal half (or zero). Adding 0.5 shifts the mantissa so the float
  // adder rounds it to nearest even for us.
  const unsigned int magic = 126u << 23;
  const unsigned int tiny = f32_to_bits(bits_to_f32(x) + bits_to_f32(magic)) - magic;
  // normal: rebias, round half up, then ties to even
  const unsigned int normal =
      (x + (static_cast<unsigned int>(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  const unsigned int out = select_bits(mask_if(x >= (143u << 23)), huge,
                                       select_bits(mask_if(x < (113u << 23)), tiny, normal));
  return static_cast<unsigned short>(out | (sign >> 16));
}

KILN_HD_CONVERSION float f16_bits_to_f32(unsigned short h) {
  const unsigned int sign = static_cast<unsigned int>(h & 0x8000u) << 16;
  const unsigned int em = h & 0x7fffu;
  const unsigned int special = 0x7f800000u | ((em & 0x3ffu) << 13);  // inf or nan
  const unsigned int normal = (em << 13) + (112u << 23);
  // em * 2^-24 (converted from a signed int, which vectorizes; unsigned does not)
  const unsigned int sub = f32_to_bits(static_cast<float>(static_cast<int>(em)) * 5.9604644775390625e-08f);
  const unsigned int out = select_bits(mask_if(em >= 0x7c00u), special,
                                       select_bits(mask_if(em >= 0x0400u), normal, sub));
  return bits_to_f32(sign | out);
}

// Round to nearest even; a nan stays a nan, made quiet (its top mantissa bit set).
KILN_HD_CONVERSION unsigned short f32_to_bf16_bits(float f) {
  const unsigned int x = f32_to_bits(f);
  const unsigned int rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const unsigned int quiet_nan = (x >> 16) | 0x40u;
  return static_cast<unsigned short>(
      select_bits(mask_if((x & 0x7fffffffu) > 0x7f800000u), quiet_nan, rounded));
}

KILN_HD_CONVERSION float bf16_bits_to_f32(unsigned short b) {
  return bits_to_f32(static_cast<unsigned int>(b) << 16);
}

struct Half {
  unsigned short bits;
  Half() = default;
  KILN_HD_CONVERSION Half(float f) : bits(f32_to_f16_bits(f)) {}
  KILN_HD_CONVERSION operator float() const { return f16_bits_to_f32(bits); }
  KILN_HD static Half from_bits(unsigned short b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  unsigned short bits;
  BFloat16() = default;
  KILN_HD_CONVERSION BFloat16(float f) : bits(f32_to_bf16_bits(f)) {}
  KILN_HD_CONVERSION operator float() const { return bf16_bits_to_f32(bits); }
  KILN_HD static BFloat16 from_bits(unsigned short b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace kiln
