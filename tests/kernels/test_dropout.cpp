// Dropout: the mask follows the Philox rule of core/ops/dropout.h exactly, is reproducible
// under manual_seed, and has the right statistics.
#include "core/ops/dropout.h"
#include "core/philox.h"
#include "kernels/cpu/philox_lanes.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("dropout's mask follows the documented Philox rule", "[index][dropout]") {
  const DType dtype = GENERATE(from_range(kFloatDTypes));
  const double p = GENERATE(0.25, 0.5, 0.9);
  CAPTURE(dtype, p);
  Generator gen(1234);
  gen.set_offset(77);
  const Tensor x = randn({6, 50}, {.dtype = dtype});
  auto [out, mask] = dropout_with_mask(x, p, true, &gen);
  CHECK(mask.dtype() == DType::boolean);
  CHECK(out.dtype() == dtype);
  CHECK(gen.offset() == 77 + 300);  // one counter per element
  std::vector<double> expected_mask, expected_out;
  const std::vector<double> xs = values(x);
  for (uint64_t i = 0; i < 300; ++i) {
    const bool keep = philox::uniform_f32(philox::random4(1234, 77 + i)) >= static_cast<float>(p);
    expected_mask.push_back(keep);
    expected_out.push_back(keep ? xs[i] / (1.0 - p) : 0.0);
  }
  KILN_CHECK_EQUAL(mask, tensor_of(expected_mask, {6, 50}, DType::boolean));
  // The scale is applied in the compute type (f32 for 16-bit floats), then rounded.
  KILN_CHECK_CLOSE(out, tensor_of(expected_out, {6, 50}, DType::f64), tol(dtype), tol(dtype));
  const Tensor grad = dropout_backward(ones_like(x), mask, p);
  CHECK(grad.dtype() == dtype);
  KILN_CHECK_CLOSE(grad, mul(mask.to(DType::f64), 1.0 / (1.0 - p)), tol(dtype), tol(dtype));
}

TEST_CASE("dropout is reproducible with manual_seed and independent of layout",
          "[index][dropout]") {
  const Tensor x = randn({8, 64});
  manual_seed(42);
  const Tensor a = dropout(x, 0.3);
  const Tensor b = dropout(x, 0.3);  // the stream moved on
  manual_seed(42);
  KILN_CHECK_EQUAL(dropout(x, 0.3), a);
  KILN_CHECK_EQUAL(dropout(x, 0.3), b);
  CHECK_FALSE(allclose(a, b, 0, 0));
  manual_seed(43);
  CHECK_FALSE(allclose(dropout(x, 0.3), a, 0, 0));
  // Element i is the row-major position, whatever the input's strides.
  manual_seed(42);
  KILN_CHECK_EQUAL(dropout(strided_copy(x), 0.3), a);
  manual_seed(42);
  KILN_CHECK_EQUAL(dropout(transposed_copy(x), 0.3), a);
}

TEST_CASE("dropout keeps 1 - p of the elements and preserves the mean", "[index][dropout]") {
  const double p = GENERATE(0.1, 0.3, 0.5);
  CAPTURE(p);
  Generator gen(7);
  const Tensor x = ones({100000});
  auto [out, mask] = dropout_with_mask(x, p, true, &gen);
  double kept = 0, sum = 0;
  for (double m : values(mask)) kept += m;
  for (double v : values(out)) sum += v;
  const double fraction = kept / 100000, mean = sum / 100000;
  // The kept fraction has standard deviation sqrt(p (1 - p) / n) <= 0.0016, and the mean
  // sqrt(p / ((1 - p) n)) <= 0.0032: 0.01 and 0.02 are over six of them.
  CHECK(std::fabs(fraction - (1 - p)) < 0.01);
  CHECK(std::fabs(mean - 1.0) < 0.02);
}

TEST_CASE("dropout's edge cases: p = 0 / p = 1 / eval mode / NaN", "[index][dropout]") {
  const Tensor x = randn({4, 5}, {.dtype = DType::f64});
  KILN_CHECK_EQUAL(dropout(x, 0.0), x);
  auto [zero, none] = dropout_with_mask(x, 1.0);
  KILN_CHECK_EQUAL(zero, zeros({4, 5}));
  KILN_CHECK_EQUAL(none, zeros({4, 5}, {.dtype = DType::boolean}));
  KILN_CHECK_EQUAL(dropout_backward(ones_like(x), none, 1.0), zeros({4, 5}));
  // Eval mode returns the input itself and draws no counters.
  const uint64_t before = default_generator().offset();
  CHECK(dropout(x, 0.5, false).same(x));
  auto [same, all] = dropout_with_mask(x, 0.5, false);
  CHECK(same.same(x));
  KILN_CHECK_EQUAL(all, ones({4, 5}, {.dtype = DType::boolean}));
  CHECK(default_generator().offset() == before);
  // Dropped NaNs stay NaN (x * 0), as in PyTorch.
  const Tensor nans = full({64}, std::nan(""));
  for (double v : values(dropout(nans, 0.5))) CHECK(std::isnan(v));
  CHECK(dropout(zeros({0, 3}), 0.5).shape() == Shape{0, 3});
}

TEST_CASE("dropout rejects bad input", "[index][dropout]") {
  const Tensor x = ones({3});
  CHECK_THROWS_WITH(dropout(x, -0.1), Catch::Contains("dropout") && Catch::Contains("-0.1"));
  CHECK_THROWS_WITH(dropout(x, 1.5), Catch::Contains("dropout") && Catch::Contains("1.5"));
  CHECK_THROWS_WITH(dropout(x, 1.5, false), Catch::Contains("dropout"));
  CHECK_THROWS_WITH(dropout(ones({3}, {.dtype = DType::i64}), 0.5),
                    Catch::Contains("dropout") && Catch::Contains("i64[3] cpu"));
  CHECK_THROWS_WITH(dropout_backward(x, ones({3}), 0.5), Catch::Contains("dropout_backward"));
  CHECK_THROWS_WITH(dropout_backward(x, ones({4}, {.dtype = DType::boolean}), 0.5),
                    Catch::Contains("dropout_backward") && Catch::Contains("[4]"));
}

TEST_CASE("the vectorized Philox lanes give philox::random4's words, in both builds",
          "[index][dropout]") {
  // kernels/cpu/philox_lanes.h, which the dropout and attention kernels draw from: every
  // lane against the one-counter function, across a carry into the counter's high word and
  // with a seed using both halves; the plain and (where the CPU has it) AVX-512 builds.
  const uint64_t seed = 0x123456789ABCDEF0ull;
  const bool has_wide = testing::wide_loops_available();
  for (int wide : {0, 1}) {
    if (wide == 1 && !has_wide) {
      WARN("this CPU has no AVX-512: one build only");
      break;
    }
    cpu::set_wide_loops(wide == 1);
    for (uint64_t first : {uint64_t{0}, uint64_t{0xFFFFFFF8u}, uint64_t{1} << 40}) {
      float kept[37];
      cpu::dropout_keep_values<float>(seed, 5, first, 37, 0.3f, 2.0f, -1.0f, kept);
      for (uint64_t j = 0; j < 37; ++j) {
        const bool keep = philox::uniform_f32(philox::random4(seed, 5 + first + j)) >= 0.3f;
        INFO("wide " << wide << " first " << first << " lane " << j);
        CHECK(kept[j] == (keep ? 2.0f : -1.0f));
      }
    }
  }
  if (has_wide) cpu::set_wide_loops(true);
  // A tensor past the parallel grain, its counters crossing 2^32: the mask follows the rule.
  Generator gen(99);
  gen.set_offset((uint64_t{1} << 32) - 1000);
  const Tensor x = ones({70001});
  const Tensor mask = dropout_with_mask(x, 0.5, true, &gen).second;
  const bool* m = mask.data_ptr<bool>();
  int64_t wrong = 0;
  for (uint64_t i = 0; i < 70001; ++i)
    wrong += m[i] != (philox::uniform_f32(philox::random4(99, (uint64_t{1} << 32) - 1000 + i)) >= 0.5f);
  CHECK(wrong == 0);
}
