// Batch normalization on channels_last (NHWC) tensors against the same ops on contiguous
// copies: the values agree to testing::tol(dtype) (f32 1e-5, f64 1e-12; relative, and
// absolute for values near 0) and the normalized outputs keep the channels_last layout.
// Shapes include one with several row blocks (the NHWC statistics sum in blocks) and
// odd channel counts.
#include "core/ops/norm.h"
#include "channels_last_testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Per-channel parameters: weight around 1, bias around 0, a positive running variance.
struct Params {
  Tensor weight, bias, running_mean, running_var;
};
Params params(int64_t channels, DType dtype) {
  return {random_of({channels}, dtype, 11) * 0.5 + 1.0, random_of({channels}, dtype, 12),
          random_of({channels}, dtype, 13), abs(random_of({channels}, dtype, 14)) + 0.5};
}

// The last is large enough for several threads.
const std::vector<Shape> kShapes = {{2, 5, 4, 3}, {3, 7, 1, 6}, {4, 3, 33, 40}, {8, 16, 32, 32}};

}  // namespace

TEST_CASE("batch_norm training on a channels_last input equals the contiguous one", "[norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  INFO(name(dtype) << " " << shape_str(shape));
  const Tensor x = random_of(shape, dtype, 1) * 3.0 + 2.0;
  const Params p = params(shape[1], dtype);
  Params pc = p, pl = p;
  pc.running_mean = p.running_mean.clone(), pc.running_var = p.running_var.clone();
  pl.running_mean = p.running_mean.clone(), pl.running_var = p.running_var.clone();
  const BatchNormResult expected =
      batch_norm_with_stats(x, p.weight, p.bias, pc.running_mean, pc.running_var, true, 0.1, 1e-5);
  const BatchNormResult actual = batch_norm_with_stats(nhwc(x), p.weight, p.bias, pl.running_mean,
                                                       pl.running_var, true, 0.1, 1e-5);
  CHECK(is_nhwc(actual.output));
  CHECK(actual.save_mean.is_contiguous());
  CHECK_SAME_VALUES(actual.output, expected.output, dtype);
  CHECK_SAME_VALUES(actual.save_mean, expected.save_mean, dtype);
  CHECK_SAME_VALUES(actual.save_invstd, expected.save_invstd, dtype);
  CHECK_SAME_VALUES(pl.running_mean, pc.running_mean, dtype);
  CHECK_SAME_VALUES(pl.running_var, pc.running_var, dtype);
}

TEST_CASE("batch_norm's one-pass NHWC statistics keep a tiny variance under a large mean", "[norm]") {
  // The NHWC statistics sum x - k and its square in one pass, k a value of the channel; the
  // NCHW ones take a second pass over the deviations. Mean 1000, standard deviation 1e-3:
  // an unshifted one-pass variance (E[x^2] - mean^2 in f64) would lose 12 of f64's 16
  // digits; shifted, the two agree to f64 roundoff on f64 data, and to the f32 result's
  // rounding on f32 data.
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape{8, 5, 16, 16};
  INFO(name(dtype));
  const Tensor x = (random_of(shape, DType::f64, 3) * 1e-3 + 1000.0).to(dtype);
  const BatchNormResult expected = batch_norm_with_stats(x, {}, {}, {}, {}, true, 0.1, 0.0);
  const BatchNormResult actual = batch_norm_with_stats(nhwc(x), {}, {}, {}, {}, true, 0.1, 0.0);
  CHECK_SAME_VALUES(actual.save_mean, expected.save_mean, dtype);
  CHECK_SAME_VALUES(actual.save_invstd, expected.save_invstd, dtype);
  // (Not the outputs: x * invstd + shift with x at 1000 and invstd at 1000 cancels to 1e-10
  // relative in f64 in either layout; that is the data's conditioning, not the statistics'.)
}

TEST_CASE("batch_norm eval on a channels_last input equals the contiguous one", "[norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  INFO(name(dtype) << " " << shape_str(shape));
  const Tensor x = random_of(shape, dtype, 2);
  const Params p = params(shape[1], dtype);
  const Tensor expected =
      batch_norm(x, p.weight, p.bias, p.running_mean, p.running_var, false, 0.1, 1e-5);
  const Tensor actual =
      batch_norm(nhwc(x), p.weight, p.bias, p.running_mean, p.running_var, false, 0.1, 1e-5);
  CHECK(is_nhwc(actual));
  CHECK_SAME_VALUES(actual, expected, dtype);
  // Without weight and bias too.
  CHECK_SAME_VALUES(batch_norm(nhwc(x), {}, {}, p.running_mean, p.running_var, false),
                    batch_norm(x, {}, {}, p.running_mean, p.running_var, false), dtype);
}

TEST_CASE("batch_norm_backward on channels_last tensors equals the contiguous one", "[norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const bool training = GENERATE(true, false);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  INFO(name(dtype) << " training " << training << " " << shape_str(shape));
  const Tensor x = random_of(shape, dtype, 3) * 2.0 - 1.0;
  const Tensor g = random_of(shape, dtype, 4);
  const Params p = params(shape[1], dtype);
  const BatchNormResult fwd = batch_norm_with_stats(x, p.weight, p.bias, p.running_mean.clone(),
                                                    p.running_var.clone(), training, 0.1, 1e-5);
  const NormGrads expected =
      batch_norm_backward(g, x, p.weight, fwd.save_mean, fwd.save_invstd, training, 1e-5);
  // Both channels_last, or either one: grad_input follows the input, else grad_out.
  for (const auto& [xi, gi] :
       {std::pair{nhwc(x), nhwc(g)}, std::pair{nhwc(x), g}, std::pair{x, nhwc(g)}}) {
    const NormGrads actual =
        batch_norm_backward(gi, xi, p.weight, fwd.save_mean, fwd.save_invstd, training, 1e-5);
    CHECK(is_nhwc(actual.grad_input));
    CHECK_SAME_VALUES(actual.grad_input, expected.grad_input, dtype);
    CHECK_SAME_VALUES(actual.grad_weight, expected.grad_weight, dtype);
    CHECK_SAME_VALUES(actual.grad_bias, expected.grad_bias, dtype);
  }
  // Both contiguous: unchanged.
  CHECK(expected.grad_input.is_contiguous());
}

TEST_CASE(
    "batch_norm_stats_update on a channels_last input equals the contiguous one and batch_norm's "
    "update",
    "[norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  INFO(name(dtype) << " " << shape_str(shape));
  const Tensor x = random_of(shape, dtype, 5) + 4.0;
  const Params p = params(shape[1], dtype);
  const RunningStats expected = batch_norm_stats_update(x, p.running_mean, p.running_var, 0.2);
  const RunningStats actual = batch_norm_stats_update(nhwc(x), p.running_mean, p.running_var, 0.2);
  CHECK_SAME_VALUES(actual.mean, expected.mean, dtype);
  CHECK_SAME_VALUES(actual.var, expected.var, dtype);
  // Bit for bit what batch_norm writes in place for the same channels_last input.
  Tensor rm = p.running_mean.clone(), rv = p.running_var.clone();
  batch_norm(nhwc(x), p.weight, p.bias, rm, rv, true, 0.2, 1e-5);
  KILN_CHECK_EQUAL(actual.mean, rm);
  KILN_CHECK_EQUAL(actual.var, rv);
}

TEST_CASE("batch_norm on a 16-bit channels_last input stays channels_last", "[norm]") {
  const Tensor x = random_of({2, 3, 4, 5}, DType::f32, 6);
  const Params p = params(3, DType::f32);
  const Tensor expected = batch_norm(x.to(DType::bf16), p.weight, p.bias, {}, {}, true);
  const Tensor actual = batch_norm(nhwc(x.to(DType::bf16)), p.weight, p.bias, {}, {}, true);
  CHECK(is_nhwc(actual));
  KILN_CHECK_CLOSE(actual, expected, tol(DType::bf16), tol(DType::bf16));
}
