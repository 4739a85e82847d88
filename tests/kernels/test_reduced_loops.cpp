// The 16-bit elementwise loops (kernels/cpu/loops.h): the AVX-512 build and the plain one
// give the same bits, and both equal the scalar conversions of core/half.h element by
// element, on odd lengths (vector tails), broadcast scalars, ties, subnormals, inf and NaN.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/wide.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// f32 values that round interestingly: random bits (every exponent), bf16 and f16 ties,
// subnormals, infinities and NaNs; an odd count so the vector loops have tails.
Tensor interesting_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u, 0x007fffffu,
                              0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u, 0xffffffffu,
                              0x3f808000u, 0x3f818000u, 0x477ff000u, 0x33000000u, 0x387fd000u};
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    switch (i % 4) {
      case 0: break;                                        // any bits
      case 1: u = (u & 0xffff0000u) | 0x8000u; break;       // a bf16 tie
      case 2: u = (u & 0xffffe000u) | 0x1000u; break;       // an f16 tie
      case 3: u = special[rng() % std::size(special)]; break;
    }
    v[i] = float_of(u);
  }
  Tensor t = empty({n});
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<uint16_t> bits16(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint16_t> b(static_cast<size_t>(c.numel()));
  std::memcpy(b.data(), c.data_ptr(), b.size() * 2);
  return b;
}

std::vector<uint32_t> bits32(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint32_t> b(static_cast<size_t>(c.numel()));
  std::memcpy(b.data(), c.data_ptr(), b.size() * 4);
  return b;
}

uint16_t round_to(DType dtype, float f) {
  return dtype == DType::bf16 ? f32_to_bf16_bits(f) : f32_to_f16_bits(f);
}
float widen(DType dtype, uint16_t b) {
  return dtype == DType::bf16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
}

struct WideScope {
  bool previous = cpu::wide_loops();
  explicit WideScope(bool on) { cpu::set_wide_loops(on); }
  ~WideScope() { cpu::set_wide_loops(previous); }
};

// The builds this CPU runs (1: AVX-512): plain always, AVX-512 where it has it.
std::vector<int> builds() {
  WideScope probe(false);
  return probe.previous ? std::vector<int>{0, 1} : std::vector<int>{0};
}

}  // namespace

TEST_CASE("16-bit loops equal the scalar conversions, in every build", "[loops][reduced]") {
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  const bool wide = GENERATE(from_range(builds())) == 1;
  INFO(name(dtype) << (wide ? " AVX-512" : " plain"));
  WideScope scope(wide);
  const int64_t n = 100'003;
  const Tensor x32 = interesting_values(n, 1), y32 = interesting_values(n, 2);
  const std::vector<uint32_t> xb = bits32(x32), yb = bits32(y32);

  // Casts both ways.
  const Tensor x = x32.to(dtype), y = y32.to(dtype);
  const std::vector<uint16_t> xs = bits16(x), ys = bits16(y);
  size_t bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) bad += xs[i] != round_to(dtype, float_of(xb[i]));
  CHECK(bad == 0);
  const std::vector<uint32_t> back = bits32(x.to(DType::f32));
  bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float w = widen(dtype, xs[i]);
    uint32_t wb;
    std::memcpy(&wb, &w, 4);
    bad += back[i] != wb;
  }
  CHECK(bad == 0);

  // Ops computed in f32 and rounded once: dense, a broadcast scalar, three inputs with a
  // scalar (where's block of copies).
  auto check_op = [&](const char* what, const Tensor& got, auto expected) {
    INFO(what);
    const std::vector<uint16_t> g = bits16(got);
    size_t wrong = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const uint16_t e = expected(i);
      // Which operand's payload a NaN + NaN keeps depends on the operand order the
      // compiler picked (x86 keeps the first): any NaN will do there.
      const bool both_nan = std::isnan(widen(dtype, g[i])) && std::isnan(widen(dtype, e));
      wrong += g[i] != e && !both_nan;
    }
    CHECK(wrong == 0);
  };
  check_op("add", x + y, [&](size_t i) { return round_to(dtype, widen(dtype, xs[i]) + widen(dtype, ys[i])); });
  check_op("mul by a scalar", x * 3, [&](size_t i) { return round_to(dtype, widen(dtype, xs[i]) * 3.0f); });
  check_op("relu", relu(x), [&](size_t i) {
    const float v = widen(dtype, xs[i]);
    return round_to(dtype, v < 0 ? 0.0f : v);
  });
  const Tensor mask = y > 0;
  check_op("where with a scalar", where(mask, x, 0), [&](size_t i) {
    return widen(dtype, ys[i]) > 0 ? xs[i] : uint16_t{0};
  });
  check_op("where", where(mask, x, y), [&](size_t i) { return widen(dtype, ys[i]) > 0 ? xs[i] : ys[i]; });
}

TEST_CASE("the AVX-512 and plain builds of 16-bit ops give the same bits", "[loops][reduced]") {
  if (builds().size() < 2) {
    WARN("no AVX-512 on this CPU: only the plain build runs");
    return;
  }
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  INFO(name(dtype));
  manual_seed(3);
  const Tensor x = (randn({3, 1001}) * 4).to(dtype), y = randn({3, 1001}).to(dtype);
  const Tensor w = randn({1001}).to(dtype);
  auto run = [&] {
    return std::vector<Tensor>{x * y + w, gelu(x), sigmoid(x), exp(y), x / (y * y + 1),
                               x.to(DType::f32) * 0.1 + y, (x > y).to(dtype), clamp(x, -1, 2)};
  };
  std::vector<Tensor> plain, wide;
  {
    WideScope s(false);
    plain = run();
  }
  {
    WideScope s(true);
    wide = run();
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("result " << i);
    CHECK(bits16(plain[i].to(dtype)) == bits16(wide[i].to(dtype)));
  }
}
