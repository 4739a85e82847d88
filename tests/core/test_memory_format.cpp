// Memory formats (core/tensor.h): channels_last strides, the checks and conversions, and how
// elementwise ops and clone carry the layout to their results (core/registry.h's
// TensorMeta::memory_format).
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("channels_last tensors have NHWC strides and keep their values", "[core][layout]") {
  const Tensor x = randn({2, 3, 4, 5});
  CHECK(strides_for({2, 3, 4, 5}, MemoryFormat::channels_last) == Shape{60, 1, 15, 3});
  CHECK(x.is_contiguous(MemoryFormat::contiguous));
  CHECK_FALSE(x.is_contiguous(MemoryFormat::channels_last));
  CHECK(x.suggest_memory_format() == MemoryFormat::contiguous);

  const Tensor y = x.contiguous(MemoryFormat::channels_last);
  CHECK(y.strides() == Shape{60, 1, 15, 3});
  CHECK(y.is_contiguous(MemoryFormat::channels_last));
  CHECK_FALSE(y.is_contiguous());
  CHECK(y.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(y, x);
  CHECK(y.contiguous(MemoryFormat::channels_last).same(y));  // already laid out: no copy
  const Tensor back = y.contiguous();
  CHECK(back.is_contiguous());
  KILN_CHECK_EQUAL(back, x);

  // A permuted contiguous NHWC tensor is channels_last too.
  const Tensor nhwc = randn({2, 4, 5, 3}).permute({0, 3, 1, 2});
  CHECK(nhwc.suggest_memory_format() == MemoryFormat::channels_last);
  CHECK(TensorMeta::of(nhwc).memory_format == MemoryFormat::channels_last);
  CHECK_THAT(TensorMeta::of(nhwc).str(), Catch::Matchers::Contains("channels_last"));
}

TEST_CASE("channels_last is ambiguous where C is 1 or the plane one pixel", "[core][layout]") {
  // The same memory either way: such tensors count as contiguous.
  for (const Shape& shape : {Shape{2, 1, 3, 3}, Shape{2, 5, 1, 1}}) {
    const Tensor y = randn(shape).contiguous(MemoryFormat::channels_last);
    CHECK(y.is_contiguous());
    CHECK(y.is_contiguous(MemoryFormat::channels_last));
    CHECK(y.suggest_memory_format() == MemoryFormat::contiguous);
  }
  CHECK(make_tensor({0, 3, 2, 2}, DType::f32, Device::cpu(), MemoryFormat::channels_last)
            .is_contiguous(MemoryFormat::channels_last));
}

TEST_CASE("channels_last needs a 4-d tensor", "[core][layout]") {
  const Tensor x = randn({2, 3, 4});
  CHECK_FALSE(x.is_contiguous(MemoryFormat::channels_last));
  CHECK_THROWS_WITH(x.contiguous(MemoryFormat::channels_last),
                    Catch::Matchers::Contains("clone: channels_last needs a 4-d") &&
                        Catch::Matchers::Contains("f32[2,3,4]"));
  CHECK_THROWS_WITH(strides_for({2, 3}, MemoryFormat::channels_last), Catch::Matchers::Contains("4-d"));
}

TEST_CASE("elementwise results follow a channels_last input of their shape", "[core][layout]") {
  const Tensor a = randn({2, 3, 4, 5}), b = randn({2, 3, 4, 5}), bias = randn({1, 3, 1, 1});
  const Tensor an = a.contiguous(MemoryFormat::channels_last);
  const Tensor sum = an + b;
  CHECK(sum.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(sum, a + b);
  const Tensor r = relu(an);
  CHECK(r.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(r, relu(a));
  // A broadcast per-channel operand does not decide; the full-size one does.
  const Tensor scaled = bias * an;
  CHECK(scaled.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(scaled, bias * a);
  const Tensor w = where(gt(an, 0), an, b);
  CHECK(w.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(w, where(gt(a, 0), a, b));
  const Tensor cast = an.to(DType::f64);
  CHECK(cast.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_EQUAL(cast, a.to(DType::f64));
  // Contiguous inputs give contiguous results, as before.
  CHECK((a + b).is_contiguous());
  CHECK((a + an.contiguous()).is_contiguous());
  // clone() stays a contiguous copy.
  CHECK(an.clone().is_contiguous());
}

TEST_CASE("autograd through channels_last tensors gives the contiguous gradients", "[core][layout]") {
  const Tensor a = randn({2, 3, 4, 5}, {.dtype = DType::f64});
  Tensor x = a.clone().requires_grad_(true), xn = a.contiguous(MemoryFormat::channels_last).detach().requires_grad_(true);
  sum(relu(x) * x).backward();
  sum(relu(xn) * xn).backward();
  KILN_CHECK_CLOSE(xn.grad(), x.grad(), 1e-12, 0);
}
