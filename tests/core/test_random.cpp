// Philox4x32-10 known answers and the properties of kiln's random stream: one counter per
// element, so seeding repeats it and consecutive calls continue it.
//
// The expected words come from Random123's kat_vectors file (counter 0, key 0) and from an
// independent Python implementation written from the paper's definition (Salmon et al.,
// SC'11), which also reproduces Random123's other two Philox4x32-10 vectors:
//
//   M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
//   def philox(ctr, key):
//       x0, x1, x2, x3 = ctr; k0, k1 = key
//       for _ in range(10):
//           p0, p1 = M0 * x0, M1 * x2
//           x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & MASK, (p0 >> 32) ^ x3 ^ k1, p0 & MASK
//           k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
//       return x0, x1, x2, x3
//
// kiln puts a 64-bit counter in words (c0, c1) = (low, high), c2 = c3 = 0, and a 64-bit
// seed in (k0, k1) = (low, high).
#include <array>

#include "core/philox.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

std::array<unsigned, 4> words(uint64_t seed, uint64_t counter) {
  const philox::Block b = philox::random4(seed, counter);
  return {b.v[0], b.v[1], b.v[2], b.v[3]};
}

}  // namespace

TEST_CASE("philox random4 matches known answers", "[philox]") {
  using W = std::array<unsigned, 4>;
  // Random123 kat_vectors: philox4x32 10, counter {0,0,0,0}, key {0,0}.
  CHECK(words(0, 0) == W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  // From the Python implementation above.
  CHECK(words(42, 7) == W{0x5bbd83b1u, 0x68784c85u, 0x172067aau, 0x2e6b75b7u});
  CHECK(words(0x0123456789abcdefull, 0xfedcba9876543210ull) ==
        W{0x2c03a599u, 0xd8a290fcu, 0x4339955bu, 0x8784c033u});
  // The default generator's seed, counter 0.
  CHECK(words(67280421310721ull, 0) == W{0x64a3e0f6u, 0xd72e25abu, 0x0be1367bu, 0x53eccf2du});
}

TEST_CASE("rand's elements are the documented function of the Philox words", "[philox]") {
  Generator g(42);
  Tensor r = rand({8}, {}, &g);
  Tensor d = rand({8}, {.dtype = DType::f64}, &g);
  for (uint64_t i = 0; i < 8; ++i) {
    const philox::Block b = philox::random4(42, i);
    CHECK(r.data_ptr<float>()[i] == static_cast<float>(b.v[0] >> 8) * 0x1p-24f);
    const philox::Block bd = philox::random4(42, 8 + i);  // the second call continues
    const uint64_t bits53 =
        ((static_cast<uint64_t>(bd.v[0]) << 21) ^ (bd.v[1] >> 11)) & ((1ull << 53) - 1);
    CHECK(d.data_ptr<double>()[i] == static_cast<double>(bits53) * 0x1p-53);
  }
  CHECK(g.offset() == 16);
  // The 16-bit floats take as many bits as they hold (11 and 8), so rand stays below 1.
  Tensor h = rand({8}, {.dtype = DType::f16}, &g);
  Tensor bf = rand({8}, {.dtype = DType::bf16}, &g);
  for (uint64_t i = 0; i < 8; ++i) {
    CHECK(at(h, {static_cast<int64_t>(i)}) ==
          static_cast<double>(philox::random4(42, 16 + i).v[0] >> 21) / 2048);
    CHECK(at(bf, {static_cast<int64_t>(i)}) ==
          static_cast<double>(philox::random4(42, 24 + i).v[0] >> 24) / 256);
  }
}

TEST_CASE("manual_seed repeats the stream", "[philox]") {
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    manual_seed(2024);
    Tensor a = rand({5, 7}, {.dtype = dtype});
    Tensor an = randn({3, 3}, {.dtype = dtype});
    Tensor ai = randint(0, 1000, {9});
    manual_seed(2024);
    Tensor b = rand({5, 7}, {.dtype = dtype});
    Tensor bn = randn({3, 3}, {.dtype = dtype});
    Tensor bi = randint(0, 1000, {9});
    KILN_CHECK_EQUAL(a, b);
    KILN_CHECK_EQUAL(an, bn);
    KILN_CHECK_EQUAL(ai, bi);
  }
  CHECK(default_generator().seed() == 2024);
}

TEST_CASE("consecutive calls draw different numbers", "[philox]") {
  manual_seed(5);
  const std::vector<double> a = values(rand({100}));
  const std::vector<double> b = values(rand({100}));
  int equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  CHECK(equal == 0);
  // Different seeds give different streams.
  manual_seed(6);
  const std::vector<double> c = values(rand({100}));
  CHECK(c != a);
  // Separate generators do not disturb each other or the default one.
  Generator g1(11), g2(11);
  KILN_CHECK_EQUAL(randn({10}, {}, &g1), randn({10}, {}, &g2));
  CHECK(g1.offset() == 10);
}

TEST_CASE("two calls equal one call of the combined size", "[philox]") {
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    manual_seed(77);
    Tensor first = rand({10}, {.dtype = dtype});
    Tensor second = rand({2, 3}, {.dtype = dtype});
    manual_seed(77);
    Tensor whole = rand({16}, {.dtype = dtype});
    KILN_CHECK_EQUAL(first, whole.slice(0, 0, 10));
    KILN_CHECK_EQUAL(second.flatten(), whole.slice(0, 10, 16));

    manual_seed(78);
    Tensor n1 = randn({10}, {.dtype = dtype});
    Tensor n2 = randn({6}, {.dtype = dtype});
    manual_seed(78);
    Tensor nw = randn({16}, {.dtype = dtype});
    KILN_CHECK_EQUAL(n1, nw.slice(0, 0, 10));
    KILN_CHECK_EQUAL(n2, nw.slice(0, 10, 16));
  }
  manual_seed(79);
  Tensor i1 = randint(0, 100, {4});
  Tensor i2 = randint(0, 100, {3});
  manual_seed(79);
  Tensor iw = randint(0, 100, {7});
  KILN_CHECK_EQUAL(i1, iw.slice(0, 0, 4));
  KILN_CHECK_EQUAL(i2, iw.slice(0, 4, 7));
}

TEST_CASE("the stream does not depend on how threads split the work", "[philox]") {
  // A large call runs on several threads; its tail equals a small single-threaded call
  // starting at the same counter.
  Generator g(3);
  Tensor big = rand({200000}, {}, &g);
  Generator h(3);
  h.set_offset(199990);
  Tensor tail = rand({10}, {}, &h);
  KILN_CHECK_EQUAL(big.slice(0, 199990, 200000), tail);
}

TEST_CASE("randn f32 and f64 streams are deterministic and distinct", "[philox]") {
  Generator g(123), h(123);
  Tensor f = randn({1000}, {}, &g);
  Tensor d = randn({1000}, {.dtype = DType::f64}, &h);
  CHECK(f.dtype() == DType::f32);
  CHECK(d.dtype() == DType::f64);
  Generator g2(123), h2(123);
  KILN_CHECK_EQUAL(randn({1000}, {}, &g2), f);
  KILN_CHECK_EQUAL(randn({1000}, {.dtype = DType::f64}, &h2), d);
  // The two read different words of the same blocks (the f64 form takes its second
  // uniform from words 2 and 3), so they are different streams.
  CHECK_FALSE(allclose(f.to(DType::f64), d, 1e-2, 1e-2));
  // Element 0 by hand from the documented Box-Muller transform.
  const philox::Block b = philox::random4(123, 0);
  const float u1 = (static_cast<float>(b.v[0] >> 8) + 1.0f) * 0x1p-24f;
  const float u2 = static_cast<float>(b.v[1] >> 8) * 0x1p-24f;
  CHECK(f.data_ptr<float>()[0] ==
        Approx(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2)).epsilon(1e-5));
}
