// Autocast (core/autocast.h): the cast policy of each op's registry entry, scopes that nest
// and switch off, parameters cast once per scope and version, f32 master gradients.
#include <cmath>

#include "testing.h"

#include "core/autocast.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"
#include "core/registry.h"

using namespace kiln;

namespace {

// bf16 keeps 8 significant bits: a value rounds to it within u = 2^-8, relatively.
constexpr double kBf16Roundoff = 1.0 / 256;

Tensor input(Shape shape, uint64_t seed, bool grad = false) {
  Generator gen(seed);
  Tensor t = randn(std::move(shape), {}, &gen);
  if (grad) t.requires_grad_(true);
  return t;
}

// The number of `cast` calls `f` makes at top level.
int casts_in(const std::function<void()>& f) {
  int n = 0;
  OpHookGuard hook([&](const OpCall& c) { n += c.op.name == "cast"; });
  f();
  return n;
}

}  // namespace

TEST_CASE("autocast follows each op's cast policy") {
  const Tensor a = input({4, 8}, 1), b = input({8, 3}, 2);
  autocast amp({.dtype = DType::bf16});
  CHECK(autocast_dtype(DeviceType::cpu) == DType::bf16);
  CHECK_FALSE(autocast_dtype(DeviceType::cuda).has_value());
  // lower: products run in the autocast dtype.
  CHECK(mm(a, b).dtype() == DType::bf16);
  CHECK(matmul(a, b).dtype() == DType::bf16);
  // f64 is left alone, as PyTorch leaves it.
  CHECK(mm(a.to(DType::f64), b.to(DType::f64)).dtype() == DType::f64);
  // f32: a bf16 input is widened.
  const Tensor low = a.to(DType::bf16);
  CHECK(softmax(low, 1).dtype() == DType::f32);
  CHECK(exp(low).dtype() == DType::f32);
  CHECK(sum(low).dtype() == DType::f32);
  // promote: the widest floating dtype among the inputs.
  CHECK(add(low, a).dtype() == DType::f32);
  CHECK(cat({low, a}, 0).dtype() == DType::f32);
  CHECK(cat({low, low}, 0).dtype() == DType::bf16);
  // none: the input's dtype.
  CHECK(relu(a).dtype() == DType::f32);
  CHECK(relu(low).dtype() == DType::bf16);
  // Integer inputs are never cast.
  CHECK(sum(arange(0, 4)).dtype() == DType::i64);
}

TEST_CASE("autocast scopes nest, switch off and end") {
  const Tensor a = input({2, 2}, 3);
  CHECK(mm(a, a).dtype() == DType::f32);
  {
    autocast amp({.dtype = DType::f16});
    CHECK(mm(a, a).dtype() == DType::f16);
    {
      autocast off({.enabled = false});
      CHECK(mm(a, a).dtype() == DType::f32);
      {
        autocast inner({.dtype = DType::bf16});
        CHECK(mm(a, a).dtype() == DType::bf16);
      }
      CHECK(mm(a, a).dtype() == DType::f32);
    }
    CHECK(mm(a, a).dtype() == DType::f16);
    // Another device type's scope leaves the CPU's alone.
    autocast gpu({.device_type = DeviceType::cuda});
    CHECK(autocast_dtype(DeviceType::cuda) == DType::f16);
    CHECK(mm(a, a).dtype() == DType::f16);
  }
  CHECK_FALSE(autocast_dtype(DeviceType::cpu).has_value());
  CHECK(mm(a, a).dtype() == DType::f32);
  CHECK_THROWS_WITH(autocast({.dtype = DType::f64}), Catch::Contains("autocast: the dtype must be bf16 or f16, got f64"));
}

TEST_CASE("autocast casts a parameter once per scope and again after it changes") {
  Tensor w = input({8, 8}, 4, true);
  const Tensor x = input({2, 8}, 5);
  autocast amp;
  // Two uses of w: one cast of w, one of x per use.
  CHECK(casts_in([&] {
          (void)mm(x, w);
          (void)mm(x, w);
        }) == 3);
  CHECK(casts_in([&] { (void)mm(x, w); }) == 1);
  // An in-place write (an optimizer step) bumps w's version: the next use casts it anew,
  // and sees the new values.
  {
    NoGradGuard no_grad;
    w.mul_(0.0);
  }
  Tensor y;
  CHECK(casts_in([&] { y = mm(x, w); }) == 2);
  CHECK(max(abs(y.to(DType::f32))).item<double>() == 0.0);
}

TEST_CASE("a parameter cast under no_grad is not reused where gradients are needed") {
  Tensor w = input({4, 4}, 8, true);
  const Tensor x = input({2, 4}, 9);
  Tensor y;
  {
    autocast amp;
    {
      NoGradGuard no_grad;
      CHECK_FALSE(mm(x, w).requires_grad());
    }
    y = mm(x, w);
  }
  REQUIRE(y.requires_grad());
  sum(y).backward();
  CHECK(w.grad().defined());
}

TEST_CASE("under autocast, gradients reach f32 parameters, within bf16's rounding") {
  Tensor w = input({16, 4}, 6, true);
  const Tensor x = input({8, 16}, 7);
  Tensor loss;
  {
    autocast amp;
    const Tensor y = mm(x, w);
    CHECK(y.dtype() == DType::bf16);
    loss = sum(y);  // f32: sum widens
    CHECK(loss.dtype() == DType::f32);
  }
  loss.backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::f32);
  // d loss / d w[i][j] = sum_n x[n][i]. Under bf16 it is the sum of x rounded to bf16 (u
  // each), accumulated in f32 and rounded to bf16 once (u): within 2u of the sum of |x|.
  const Tensor exact = sum(x, {0}).unsqueeze(1).expand({16, 4});
  const Tensor bound = sum(abs(x), {0}).unsqueeze(1).expand({16, 4}) * (2 * kBf16Roundoff) + 1e-6;
  CHECK(all(le(abs(sub(w.grad(), exact)), bound)).item<bool>());
}
