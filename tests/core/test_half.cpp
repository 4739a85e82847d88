// The branch-free f16/bf16 conversions of core/half.h against the plain branching ones they
// replaced, kept here as the reference: every 16-bit pattern to f32, and to 16 bits a sweep
// of all f32 exponents plus every rounding tie (and its neighbours), subnormals, infinities
// and NaNs. Bits must match exactly, NaN payloads included.
#include <cstring>
#include <vector>

#include "testing.h"

using namespace kiln;

namespace {

unsigned int bits_of(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float float_of(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The reference conversions: core/half.h before it went branch-free.
unsigned short reference_f32_to_f16(float f) {
  unsigned int x = bits_of(f);
  const unsigned int sign = x & 0x80000000u;
  x ^= sign;
  unsigned int out;
  if (x >= (143u << 23)) {
    out = x > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (x < (113u << 23)) {
    const unsigned int magic = 126u << 23;
    out = bits_of(float_of(x) + float_of(magic)) - magic;
  } else {
    const unsigned int mant_odd = (x >> 13) & 1u;
    x += (static_cast<unsigned int>(15 - 127) << 23) + 0xfffu;
    x += mant_odd;
    out = x >> 13;
  }
  return static_cast<unsigned short>(out | (sign >> 16));
}

float reference_f16_to_f32(unsigned short h) {
  const unsigned int sign = static_cast<unsigned int>(h & 0x8000u) << 16;
  const unsigned int em = h & 0x7fffu;
  if (em >= 0x7c00u) return float_of(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return float_of(sign | ((em << 13) + (112u << 23)));
  const float sub = static_cast<float>(em) * 5.9604644775390625e-08f;
  return sign ? -sub : sub;
}

unsigned short reference_f32_to_bf16(float f) {
  const unsigned int x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  const unsigned int rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>((x + rounding) >> 16);
}

float reference_bf16_to_f32(unsigned short b) { return float_of(static_cast<unsigned int>(b) << 16); }

// f32 bit patterns that exercise both roundings: a sweep over the whole range, and every
// tie of bf16 (low 16 bits 0x8000) and of normal f16 (low 13 bits 0x1000) with neighbours,
// the ties of subnormal f16 (odd multiples of 2^-25), and named special values.
std::vector<unsigned int> test_patterns() {
  std::vector<unsigned int> v;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 509) v.push_back(static_cast<unsigned int>(x));
  for (unsigned int high = 0; high <= 0xffffu; ++high)
    for (unsigned int low : {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu})
      v.push_back(high << 16 | low);
  for (unsigned int high = 0; high < (1u << 19); ++high)
    for (unsigned int low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu})
      v.push_back(high << 13 | low);
  for (unsigned int k = 0; k < 4096; ++k) {  // k * 2^-25: ties when k is odd and < 2048
    const unsigned int t = bits_of(static_cast<float>(k) * 2.98023223876953125e-08f);
    for (unsigned int sign : {0u, 0x80000000u})
      for (unsigned int u : {t - 1, t, t + 1}) v.push_back(sign | u);
  }
  for (unsigned int u : {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u,  // zeros, subnormals
                         0x7f7fffffu, 0x7f800000u, 0xff800000u,                          // max, inf
                         0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fffffffu,              // NaNs
                         0xff800001u, 0xffc00000u, 0xffffffffu, 0x7f80ffffu, 0x7f810000u,
                         0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u,              // f16 max, overflow
                         0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u})             // f16 smallest
    v.push_back(u);
  return v;
}

}  // namespace

TEST_CASE("every bf16 and f16 pattern converts to f32 as the reference does", "[half]") {
  for (unsigned int b = 0; b <= 0xffffu; ++b) {
    const auto h = static_cast<unsigned short>(b);
    REQUIRE(bits_of(bf16_bits_to_f32(h)) == bits_of(reference_bf16_to_f32(h)));
    REQUIRE(bits_of(static_cast<float>(BFloat16::from_bits(h))) == bits_of(reference_bf16_to_f32(h)));
    REQUIRE(bits_of(f16_bits_to_f32(h)) == bits_of(reference_f16_to_f32(h)));
    REQUIRE(bits_of(static_cast<float>(Half::from_bits(h))) == bits_of(reference_f16_to_f32(h)));
  }
}

TEST_CASE("f32 to bf16 and f16 round as the reference does: ties, subnormals, inf, NaN", "[half]") {
  const std::vector<unsigned int> patterns = test_patterns();
  REQUIRE(patterns.size() > 12'000'000);
  // Converted in a loop, as the kernels do (which the compiler vectorizes), then checked.
  std::vector<unsigned short> bf16(patterns.size()), f16(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    bf16[i] = f32_to_bf16_bits(float_of(patterns[i]));
    f16[i] = Half(float_of(patterns[i])).bits;
  }
  size_t bf16_bad = 0, f16_bad = 0, first_bf16_bad = 0, first_f16_bad = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const float f = float_of(patterns[i]);
    if (bf16[i] != reference_f32_to_bf16(f) && bf16_bad++ == 0) first_bf16_bad = i;
    if (f16[i] != reference_f32_to_f16(f) && f16_bad++ == 0) first_f16_bad = i;
  }
  INFO("first bf16 mismatch at f32 bits " << std::hex << patterns[first_bf16_bad]);
  CHECK(bf16_bad == 0);
  INFO("first f16 mismatch at f32 bits " << std::hex << patterns[first_f16_bad]);
  CHECK(f16_bad == 0);
  // One at a time too (the scalar code the compiler emits outside vector loops).
  for (unsigned int u : {0x7f800001u, 0xffc00001u, 0x3f808000u, 0x3f818000u, 0x00008000u, 0x387fd000u}) {
    CHECK(f32_to_bf16_bits(float_of(u)) == reference_f32_to_bf16(float_of(u)));
    CHECK(f32_to_f16_bits(float_of(u)) == reference_f32_to_f16(float_of(u)));
  }
}
