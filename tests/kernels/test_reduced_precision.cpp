// The ops of a ResNet training step under autocast, run in bf16 and f16 against the same
// ops in f32 on the same (rounded) values, forward and backward, NCHW and channels_last:
// every op here computes in f32 and rounds its result once, so it must land within one
// rounding of the f32 result, plus what f32's own summation order may move.
//
// Tolerances: a 16-bit float with p bits of precision (bf16: 8, f16: 11) rounds to
// nearest with a relative error of at most u = 2^-p, so a result rounded once is within
// u |f32 result|. Both sides sum k terms in f32 (the bf16 GEMM in pairs, the f32 one in
// its own order): each side's sum is within k 2^-24 S of the exact one, S the sum of the
// terms' magnitudes, at most k here (N(0,1) inputs, |ab| averaging 2/pi), so the sides
// differ by up to 2 k^2 2^-24 absolute, plus u of that again after the rounding.
#include "core/ops/conv.h"
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "channels_last_testing.h"
#include "kernels/cpu/gemm.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// rtol and atol for a result rounded once from an f32 sum of k terms (k = 1: no sum).
struct Tolerance {
  double rtol, atol;
};
Tolerance rounded_once(DType dtype, double k) {
  const double u = unit_roundoff(dtype);
  return {u * 1.001, (1 + u) * 2 * k * k * 0x1p-24};
}

// x rounded to `dtype`, and those values in f32: the inputs both sides see.
struct Pair {
  Tensor low, f32;
};
Pair rounded(const Tensor& x, DType dtype) {
  const Tensor low = x.to(dtype);
  return {low, low.to(DType::f32)};
}

#define CHECK_ROUNDED_ONCE(low, ref, dtype, k)                                  \
  do {                                                                         \
    const ::kiln::Tensor low_ = (low);                                         \
    CHECK(low_.dtype() == (dtype));                                            \
    const Tolerance t_ = rounded_once((dtype), (k));                           \
    KILN_CHECK_CLOSE(low_, (ref), t_.rtol, t_.atol);                           \
  } while (0)

std::vector<MemoryFormat> formats() { return {MemoryFormat::contiguous, kNhwc}; }

struct PathScope {
  cpu::Bf16GemmPath previous = cpu::bf16_gemm_path();
  explicit PathScope(cpu::Bf16GemmPath p) { cpu::set_bf16_gemm_path(p); }
  ~PathScope() { cpu::set_bf16_gemm_path(previous); }
};

}  // namespace

TEST_CASE("16-bit mm, bmm, addmm and linear round the f32 product once", "[reduced]") {
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  const cpu::Bf16GemmPath path = GENERATE(from_range(cpu::bf16_gemm_paths()));
  PathScope scope(path);
  INFO(name(dtype) << ", bf16 GEMM path " << cpu::bf16_gemm_path_name(path));
  // Odd sizes, and one past the dot path's blocks (384 k, 96 rows).
  for (const auto& [m, k, n] : {std::array<int64_t, 3>{3, 5, 7}, {97, 391, 33}, {2, 64, 10}}) {
    INFO("m=" << m << " k=" << k << " n=" << n);
    const Pair a = rounded(randn({m, k}), dtype), b = rounded(randn({k, n}), dtype);
    CHECK_ROUNDED_ONCE(mm(a.low, b.low), mm(a.f32, b.f32), dtype, k);
    // Transposed operands go to the GEMM as they are.
    const Pair at = rounded(randn({k, m}), dtype), bt = rounded(randn({n, k}), dtype);
    CHECK_ROUNDED_ONCE(mm(at.low.t(), bt.low.t()), mm(at.f32.t(), bt.f32.t()), dtype, k);
    // linear's backward: grad_input = g @ W, grad_weight = g^T @ x.
    const Pair g = rounded(randn({m, n}), dtype);
    CHECK_ROUNDED_ONCE(mm(g.low.t(), a.low), mm(g.f32.t(), a.f32), dtype, m);
    const Pair bias = rounded(randn({n}), dtype);
    CHECK_ROUNDED_ONCE(addmm(bias.low, a.low, b.low), addmm(bias.f32, a.f32, b.f32), dtype, k + 1);
  }
  const Pair sa = rounded(randn({3, 17, 9}), dtype), sb = rounded(randn({3, 9, 40}), dtype);
  CHECK_ROUNDED_ONCE(bmm(sa.low, sb.low), bmm(sa.f32, sb.f32), dtype, 9);
  CHECK_ROUNDED_ONCE(matmul(sa.low, sb.low[0]), matmul(sa.f32, sb.f32[0]), dtype, 9);
}

TEST_CASE("16-bit conv2d and its gradients round the f32 results once", "[reduced][conv]") {
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  const MemoryFormat format = GENERATE(from_range(formats()));
  const cpu::Bf16GemmPath path = GENERATE(from_range(cpu::bf16_gemm_paths()));
  PathScope scope(path);
  struct Case {
    Shape input, weight;
    Conv2dOptions options;
  };
  // ResNet's shapes, small: the 7x7 stride-2 stem, 3x3, 1x1 (pointwise and strided),
  // grouped and depthwise (NCHW loops), odd channel counts. bf16 NCHW convolutions run the
  // NHWC algorithms below 256 output pixels a plane (kernels/cpu/conv.cpp): the first two
  // cases have more.
  const std::vector<Case> cases = {
      {{2, 4, 18, 17}, {6, 4, 3, 3}, {.padding = {1, 1}}},
      {{2, 8, 16, 17}, {5, 8, 1, 1}, {}},
      {{2, 3, 17, 15}, {8, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
      {{3, 16, 9, 9}, {16, 16, 3, 3}, {.padding = {1, 1}}},
      {{2, 24, 7, 7}, {40, 24, 1, 1}, {}},
      {{2, 12, 8, 8}, {20, 12, 1, 1}, {.stride = {2, 2}}},
      {{2, 5, 6, 6}, {7, 5, 3, 3}, {.padding = {1, 1}}},
      {{2, 8, 6, 6}, {8, 2, 3, 3}, {.padding = {1, 1}, .groups = 4}},
      {{2, 6, 6, 6}, {6, 1, 3, 3}, {.padding = {1, 1}, .groups = 6}},
  };
  for (const Case& c : cases) {
    INFO(name(dtype) << " " << (format == kNhwc ? "channels_last" : "contiguous") << " path "
                     << cpu::bf16_gemm_path_name(path) << " input " << shape_str(c.input) << " weight "
                     << shape_str(c.weight));
    const Pair x = rounded(randn(c.input).contiguous(format), dtype);
    const Pair w = rounded(randn(c.weight), dtype);
    const Pair b = rounded(randn({c.weight[0]}), dtype);
    const Tensor y32 = conv2d(x.f32, w.f32, b.f32, c.options);
    const double k_fwd = static_cast<double>(c.weight[1] * c.weight[2] * c.weight[3] + 1);
    const Tensor y = conv2d(x.low, w.low, b.low, c.options);
    CHECK_ROUNDED_ONCE(y, y32, dtype, k_fwd);
    if (format == kNhwc && c.options.groups == 1) CHECK(is_nhwc(y));
    const Pair g = rounded(randn(y32.shape()).contiguous(format), dtype);
    const double k_in = static_cast<double>(c.weight[0] / c.options.groups * c.weight[2] *
                                            c.weight[3]);
    CHECK_ROUNDED_ONCE(conv2d_backward_input(g.low, w.low, c.input, c.options),
                       conv2d_backward_input(g.f32, w.f32, c.input, c.options), dtype, k_in);
    const double k_w = static_cast<double>(y32.size(0) * y32.size(2) * y32.size(3));
    CHECK_ROUNDED_ONCE(conv2d_backward_weight(g.low, x.low, c.weight, c.options),
                       conv2d_backward_weight(g.f32, x.f32, c.weight, c.options), dtype, k_w);
    // The weight gradient added to one there already (the compiler's `grad += g`), in f32
    // master weights' dtype and in the low dtype.
    const Pair acc = rounded(randn(c.weight), dtype);
    const Tensor sum32 = conv2d_backward_weight(g.f32, x.f32, c.weight, c.options, acc.f32);
    CHECK_ROUNDED_ONCE(conv2d_backward_weight(g.low, x.low, c.weight, c.options, acc.low), sum32,
                       dtype, k_w + 1);
  }
}

TEST_CASE("16-bit batch_norm forward and backward, with f32 parameters", "[reduced][norm]") {
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  const MemoryFormat format = GENERATE(from_range(formats()));
  INFO(name(dtype) << " " << (format == kNhwc ? "channels_last" : "contiguous"));
  // Autocast leaves batch norm's f32 parameters and running statistics f32 (its policy is
  // `none`): a bf16 activation meets f32 weight, bias and statistics.
  const Shape shape = {4, 6, 5, 7};
  const Pair x = rounded((randn(shape) * 3 + 1).contiguous(format), dtype);
  const Tensor weight = randn({6}), bias = randn({6});
  const double n = 4 * 5 * 7;
  Tensor rm32 = zeros({6}), rv32 = ones({6}), rm = zeros({6}), rv = ones({6});
  const BatchNormResult ref = batch_norm_with_stats(x.f32, weight, bias, rm32, rv32, true);
  const BatchNormResult low = batch_norm_with_stats(x.low, weight, bias, rm, rv, true);
  // y = (x - mean) invstd w + b, computed in f32 from statistics of n terms.
  CHECK_ROUNDED_ONCE(low.output, ref.output, dtype, std::sqrt(n));
  if (format == kNhwc) CHECK(is_nhwc(low.output));
  // The statistics stay f32 whatever the activation: sums of n terms.
  CHECK(low.save_mean.dtype() == DType::f32);
  CHECK(rm.dtype() == DType::f32);
  KILN_CHECK_CLOSE(low.save_mean, ref.save_mean, 1e-6, n * 0x1p-24 * 4);
  KILN_CHECK_CLOSE(low.save_invstd, ref.save_invstd, 1e-5, 1e-6);
  KILN_CHECK_CLOSE(rm, rm32, 1e-6, 1e-6);
  KILN_CHECK_CLOSE(rv, rv32, 1e-5, 1e-5);
  // Backward: sums over n of g and g xhat, then one rounded expression per element.
  const Pair g = rounded(randn(shape).contiguous(format), dtype);
  const NormGrads gl = batch_norm_backward(g.low, x.low, weight, low.save_mean, low.save_invstd, true);
  const NormGrads gr = batch_norm_backward(g.f32, x.f32, weight, ref.save_mean, ref.save_invstd, true);
  CHECK_ROUNDED_ONCE(gl.grad_input, gr.grad_input, dtype, std::sqrt(n));
  // The parameter gradients are the f32 parameters' (autocast's master weights).
  CHECK(gl.grad_weight.dtype() == DType::f32);
  KILN_CHECK_CLOSE(gl.grad_weight, gr.grad_weight, 1e-5, n * 0x1p-24 * 8);
  KILN_CHECK_CLOSE(gl.grad_bias, gr.grad_bias, 1e-5, n * 0x1p-24 * 8);
  // Eval mode: the running statistics.
  CHECK_ROUNDED_ONCE(batch_norm(x.low, weight, bias, rm, rv, false),
                     batch_norm(x.f32, weight, bias, rm, rv, false), dtype, 1);
}

TEST_CASE("16-bit relu, add, max_pool2d and adaptive_avg_pool2d", "[reduced][pool]") {
  const DType dtype = GENERATE(DType::bf16, DType::f16);
  const MemoryFormat format = GENERATE(from_range(formats()));
  INFO(name(dtype) << " " << (format == kNhwc ? "channels_last" : "contiguous"));
  const Shape shape = {2, 5, 9, 8};
  const Pair x = rounded(randn(shape).contiguous(format), dtype);
  const Pair r = rounded(randn(shape).contiguous(format), dtype);
  // relu and max are exact; a sum of two 16-bit values is exact in f32, then rounded once.
  KILN_CHECK_EQUAL(relu(x.low), relu(x.f32));
  CHECK(relu(x.low).dtype() == dtype);
  CHECK_ROUNDED_ONCE(x.low + r.low, x.f32 + r.f32, dtype, 1);
  CHECK_ROUNDED_ONCE(relu(x.low + r.low), relu(x.f32 + r.f32), dtype, 1);
  // ResNet's stem pool: 3x3, stride 2, padding 1 (overlapping windows).
  const MaxPool2dResult mp = max_pool2d_with_indices(x.low, {3, 3}, {2, 2}, {1, 1});
  const MaxPool2dResult mp32 = max_pool2d_with_indices(x.f32, {3, 3}, {2, 2}, {1, 1});
  KILN_CHECK_EQUAL(mp.values, mp32.values);
  CHECK(mp.values.dtype() == dtype);
  KILN_CHECK_EQUAL(mp.indices, mp32.indices);
  // The backward sums up to 4 overlapping windows' gradients, then rounds.
  const Pair g = rounded(randn(mp32.values.shape()).contiguous(format), dtype);
  CHECK_ROUNDED_ONCE(max_pool2d_backward(g.low, mp.indices, shape, format),
                     max_pool2d_backward(g.f32, mp32.indices, shape, format), dtype, 4);
  // The head's global average pool, and one with uneven windows.
  for (const std::vector<int64_t>& out : {std::vector<int64_t>{1, 1}, {4, 3}}) {
    const Tensor p = adaptive_avg_pool2d(x.low, out), p32 = adaptive_avg_pool2d(x.f32, out);
    CHECK_ROUNDED_ONCE(p, p32, dtype, 72);
    const Pair gp = rounded(randn(p32.shape()), dtype);
    CHECK_ROUNDED_ONCE(adaptive_avg_pool2d_backward(gp.low, shape, format),
                       adaptive_avg_pool2d_backward(gp.f32, shape, format), dtype, 4);
  }
}
