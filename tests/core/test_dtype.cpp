// DType sizes and names, PyTorch's promotion table, torch.result_type with wrapped numbers
// and 0-d tensors, and the f16/bf16 conversions (round to nearest even, subnormals, inf,
// NaN). Expectations are written by hand from PyTorch's documented rules.
#include <cmath>
#include <cstring>
#include <limits>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr DType f32 = DType::f32, f64 = DType::f64, f16 = DType::f16, bf16 = DType::bf16,
                i64 = DType::i64, i32 = DType::i32, u8 = DType::u8, b8 = DType::boolean;

TensorMeta dims(DType t) { return TensorMeta{{2, 3}, t, Device::cpu()}; }
TensorMeta zero_dim(DType t) { return TensorMeta{{}, t, Device::cpu()}; }
// A number written in the program: bool, i64 or f64, as Scalar::kind() says.
TensorMeta number(Scalar s) { return TensorMeta{{}, s.kind(), Device::cpu(), true}; }

DType rt(std::initializer_list<TensorMeta> metas) {
  std::vector<TensorMeta> v(metas);
  return result_type(v);
}

float f16_round(float x) { return static_cast<float>(Half(x)); }
float bf16_round(float x) { return static_cast<float>(BFloat16(x)); }

}  // namespace

TEST_CASE("dtype itemsize and names", "[dtype]") {
  const std::vector<std::tuple<DType, size_t, std::string_view>> table = {
      {f32, 4, "f32"}, {f64, 8, "f64"}, {f16, 2, "f16"}, {bf16, 2, "bf16"},
      {i64, 8, "i64"}, {i32, 4, "i32"}, {u8, 1, "u8"},   {b8, 1, "bool"}};
  for (auto [t, size, n] : table) {
    CHECK(itemsize(t) == size);
    CHECK(name(t) == n);
    CHECK(fmt::format("{}", t) == n);
  }
  CHECK(is_floating(f16));
  CHECK(is_floating(bf16));
  CHECK_FALSE(is_floating(i64));
  CHECK(is_integral(u8));
  CHECK_FALSE(is_integral(b8));
  CHECK(is_integral(b8, true));
  CHECK(is_reduced_float(bf16));
  CHECK_FALSE(is_reduced_float(f32));
}

TEST_CASE("promote_types follows torch.promote_types", "[dtype]") {
  // Every unordered pair, by hand. Order: f32 f64 f16 bf16 i64 i32 u8 bool.
  const std::vector<DType> order = {f32, f64, f16, bf16, i64, i32, u8, b8};
  const DType table[8][8] = {
      /* f32  */ {f32, f64, f32, f32, f32, f32, f32, f32},
      /* f64  */ {f64, f64, f64, f64, f64, f64, f64, f64},
      /* f16  */ {f32, f64, f16, f32, f16, f16, f16, f16},
      /* bf16 */ {f32, f64, f32, bf16, bf16, bf16, bf16, bf16},
      /* i64  */ {f32, f64, f16, bf16, i64, i64, i64, i64},
      /* i32  */ {f32, f64, f16, bf16, i64, i32, i32, i32},
      /* u8   */ {f32, f64, f16, bf16, i64, i32, u8, u8},
      /* bool */ {f32, f64, f16, bf16, i64, i32, u8, b8},
  };
  for (size_t i = 0; i < 8; ++i) {
    for (size_t j = 0; j < 8; ++j) {
      INFO(name(order[i]) << " with " << name(order[j]));
      CHECK(promote_types(order[i], order[j]) == table[i][j]);
      CHECK(table[i][j] == table[j][i]);  // the table itself is symmetric
    }
  }
}

TEST_CASE("result_type: dimensioned tensors promote fully", "[dtype]") {
  CHECK(rt({dims(i32), dims(f32)}) == f32);
  CHECK(rt({dims(f16), dims(bf16)}) == f32);
  CHECK(rt({dims(u8), dims(i32)}) == i32);
  CHECK(rt({dims(f16), dims(f64)}) == f64);
  CHECK(rt({dims(b8), dims(b8)}) == b8);
  CHECK(rt({dims(i64)}) == i64);
  CHECK(rt({}) == f32);  // nothing to go on: the default float
}

TEST_CASE("result_type: wrapped numbers only matter across categories", "[dtype]") {
  CHECK(rt({dims(i32), number(2.5)}) == f32);  // int tensor + float literal: default float
  CHECK(rt({dims(i64), number(2.5)}) == f32);
  CHECK(rt({dims(f16), number(2.5)}) == f16);  // same category: tensor's dtype stays
  CHECK(rt({dims(bf16), number(2.5)}) == bf16);
  CHECK(rt({dims(f32), number(2.5)}) == f32);
  CHECK(rt({dims(u8), number(1)}) == u8);  // u8 + 1 stays u8
  CHECK(rt({dims(i32), number(1)}) == i32);
  CHECK(rt({dims(b8), number(1)}) == i64);  // bool + int literal: i64
  CHECK(rt({dims(b8), number(2.5)}) == f32);
  CHECK(rt({dims(b8), number(true)}) == b8);
  CHECK(rt({dims(f16), number(1)}) == f16);
  CHECK(rt({number(1), number(2)}) == i64);  // only numbers
  CHECK(rt({number(1), number(2.5)}) == f32);
  CHECK(rt({number(true), number(false)}) == b8);
}

TEST_CASE("result_type: 0-d tensors win only a higher category", "[dtype]") {
  CHECK(rt({dims(f32), zero_dim(f64)}) == f32);  // same category: dimensioned wins
  CHECK(rt({dims(f16), zero_dim(f64)}) == f16);
  CHECK(rt({dims(i32), zero_dim(f64)}) == f64);  // 0-d float over int tensor: its dtype
  CHECK(rt({dims(i32), zero_dim(f16)}) == f16);
  CHECK(rt({dims(u8), zero_dim(i64)}) == u8);
  CHECK(rt({dims(b8), zero_dim(i32)}) == i32);
  CHECK(rt({dims(b8), zero_dim(f64)}) == f64);
  CHECK(rt({zero_dim(f64), dims(i64)}) == f64);  // order does not matter
  // 0-d tensors against each other promote fully, and outrank numbers in-category.
  CHECK(rt({zero_dim(i32), zero_dim(i64)}) == i64);
  CHECK(rt({zero_dim(f64), number(2.5)}) == f64);
  CHECK(rt({zero_dim(i32), number(2.5)}) == f32);
  CHECK(rt({zero_dim(f16), number(2.5)}) == f16);
  CHECK(rt({zero_dim(u8), number(1)}) == u8);
  // All three groups: dims i32, 0-d f64, float literal -> f64.
  CHECK(rt({dims(i32), zero_dim(f64), number(2.5)}) == f64);
  CHECK(rt({dims(i32), zero_dim(i64), number(2.5)}) == f32);
}

TEST_CASE("result_type shows up in real op results", "[dtype]") {
  Tensor i = from_vector<int32_t>({1, 2});
  Tensor h = from_vector<float>({1, 2}).to(f16);
  CHECK((i + 2.5).dtype() == f32);
  CHECK((h * 2.5).dtype() == f16);
  CHECK((i + scalar_tensor(1.0, f64)).dtype() == f64);
  CHECK((from_vector<float>({1, 2}) + scalar_tensor(1.0, f64)).dtype() == f32);
  CHECK((from_vector<bool>({true, false}) + 1).dtype() == i64);
  CHECK((from_vector<uint8_t>({1, 2}) + 1).dtype() == u8);
  CHECK((from_vector<uint8_t>({1, 2}) + i).dtype() == i32);
  CHECK((h + from_vector<float>({1, 2}).to(bf16)).dtype() == f32);
}

TEST_CASE("f16 conversion rounds to nearest even", "[dtype]") {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -10);                 // f16 spacing just above 1
  CHECK(f16_round(one + std::ldexp(1.0f, -11)) == one);                // tie: down to even
  CHECK(f16_round(one + 3 * std::ldexp(1.0f, -11)) == one + 2 * ulp);  // tie: up to even
  CHECK(f16_round(one + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) ==
        one + ulp);  // past the tie
  CHECK(f16_round(one + std::ldexp(1.0f, -12)) == one);
  CHECK(f16_round(-one - 3 * std::ldexp(1.0f, -11)) == -one - 2 * ulp);
  CHECK(f16_round(0.1f) == 0.0999755859375f);
  CHECK(Half(1.0f).bits == 0x3c00);
  CHECK(Half(-2.0f).bits == 0xc000);
}

TEST_CASE("f16 subnormals / range limits and special values", "[dtype]") {
  const float tiny = std::ldexp(1.0f, -24);  // the smallest f16 subnormal
  CHECK(Half(tiny).bits == 0x0001);
  CHECK(f16_round(tiny) == tiny);
  CHECK(Half(std::ldexp(1.0f, -25)).bits == 0x0000);  // tie with 0: to even (0)
  CHECK(Half(std::ldexp(1.0f, -25) * 1.0001f).bits == 0x0001);
  CHECK(Half(3 * std::ldexp(1.0f, -26)).bits == 0x0001);  // 0.75 ulp: up
  CHECK(Half(3 * std::ldexp(1.0f, -25)).bits == 0x0002);  // 1.5 ulp: tie to even (2)
  CHECK(Half(5 * std::ldexp(1.0f, -25)).bits == 0x0002);  // 2.5 ulp: tie to even (2)
  CHECK(Half(std::ldexp(1.0f, -14)).bits == 0x0400);      // smallest normal
  CHECK(Half(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)).bits ==
        0x0400);                                         // rounds up into normals
  CHECK(Half(std::ldexp(1023.0f, -24)).bits == 0x03ff);  // largest subnormal
  CHECK(f16_round(65504.0f) == 65504.0f);
  CHECK(Half(65504.0f).bits == 0x7bff);
  CHECK(Half(65519.0f).bits == 0x7bff);  // below the midpoint to 2^16
  CHECK(Half(65520.0f).bits == 0x7c00);  // the midpoint rounds (to even) to inf
  CHECK(Half(1e6f).bits == 0x7c00);
  CHECK(Half(-1e6f).bits == 0xfc00);
  CHECK(Half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(Half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(Half(-0.0f).bits == 0x8000);
  CHECK(std::signbit(static_cast<float>(Half::from_bits(0x8000))));
  CHECK(static_cast<float>(Half::from_bits(0x8000)) == 0.0f);
  const Half nan(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan.bits & 0x7c00) == 0x7c00);
  CHECK((nan.bits & 0x03ff) != 0);
  CHECK(std::isnan(static_cast<float>(nan)));
  CHECK(std::isnan(static_cast<float>(Half(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("every f16 bit pattern survives a round trip through float", "[dtype]") {
  int mismatches = 0;
  for (unsigned bits = 0; bits < 65536; ++bits) {
    const Half h = Half::from_bits(static_cast<unsigned short>(bits));
    const float f = static_cast<float>(h);
    const bool is_nan = (bits & 0x7c00) == 0x7c00 && (bits & 0x03ff) != 0;
    if (is_nan) {
      mismatches += !std::isnan(f) || !std::isnan(static_cast<float>(Half(f)));
      continue;
    }
    mismatches += Half(f).bits != bits;
    // The float value is the exact one the bits spell.
    const int exponent = static_cast<int>((bits >> 10) & 0x1f);
    const int mantissa = static_cast<int>(bits & 0x3ff);
    double expected = exponent == 0    ? std::ldexp(mantissa, -24)
                      : exponent == 31 ? std::numeric_limits<double>::infinity()
                                       : std::ldexp(1024 + mantissa, exponent - 25);
    if (bits & 0x8000) expected = -expected;
    mismatches += static_cast<double>(f) != expected;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN", "[dtype]") {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);
  CHECK(bf16_round(one + std::ldexp(1.0f, -8)) == one);                // tie: down to even
  CHECK(bf16_round(one + 3 * std::ldexp(1.0f, -8)) == one + 2 * ulp);  // tie: up to even
  CHECK(bf16_round(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -16)) == one + ulp);
  CHECK(BFloat16(1.0f).bits == 0x3f80);
  CHECK(BFloat16(-0.0f).bits == 0x8000);
  CHECK(BFloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(BFloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds past the max
  CHECK(BFloat16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(bf16_round(std::ldexp(1.0f, -133)) == std::ldexp(1.0f, -133));  // a bf16 subnormal
  for (float n : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::signaling_NaN()}) {
    const BFloat16 b(n);
    CHECK(std::isnan(static_cast<float>(b)));
  }
  // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
  CHECK(std::isnan(static_cast<float>(BFloat16(bits_to_f32(0x7f800001u)))));
  // Every bf16 pattern round-trips.
  int mismatches = 0;
  for (unsigned bits = 0; bits < 65536; ++bits) {
    const BFloat16 b = BFloat16::from_bits(static_cast<unsigned short>(bits));
    const float f = static_cast<float>(b);
    if (std::isnan(f)) continue;
    mismatches += BFloat16(f).bits != bits;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("tensor casts to f16 and bf16 round the same way", "[dtype]") {
  Tensor x = from_vector<float>({1.0f + std::ldexp(1.0f, -11), 65520.0f, std::ldexp(1.0f, -25),
                                 -0.0f, 1.0f + std::ldexp(1.0f, -8)});
  Tensor h = x.to(f16).to(f32);
  CHECK(values(h) == std::vector<double>{1.0, INFINITY, 0.0, 0.0, 1.0 + std::ldexp(1.0, -8)});
  Tensor b = x.to(bf16).to(f32);
  CHECK(b.data_ptr<float>()[4] == 1.0f);
  CHECK(std::signbit(h.data_ptr<float>()[3]));
}
