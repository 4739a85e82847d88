// conv2d against a naive 7-loop reference in doubles over strides, padding, dilation and
// groups (depthwise included); its two gradients through the adjoint identities
// <conv(x, w), g> == <x, backward_input(g, w)> == <w, backward_weight(g, x)> in f64.
#include "core/ops/conv.h"
#include "kernels/cpu/gemm.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct ConvCase {
  Shape input, weight;
  Conv2dOptions options;
  bool bias;
};

std::string describe(const ConvCase& c) {
  const Conv2dOptions& o = c.options;
  return fmt::format(
      "input {} weight {} stride [{},{}] padding [{},{}] dilation [{},{}] groups {} bias {}",
      shape_str(c.input), shape_str(c.weight), o.stride[0], o.stride[1], o.padding[0], o.padding[1],
      o.dilation[0], o.dilation[1], o.groups, c.bias);
}

// The convolution summed in doubles, one output element at a time.
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t OH = (H + 2 * o.padding[0] - o.dilation[0] * (KH - 1) - 1) / o.stride[0] + 1;
  const int64_t OW = (W + 2 * o.padding[1] - o.dilation[1] * (KW - 1) - 1) / o.stride[1] + 1;
  const int64_t Og = O / o.groups;
  (void)C;
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oc = 0; oc < O; ++oc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bias.defined() ? at(bias, {oc}) : 0.0;
          const int64_t group = oc / Og;
          for (int64_t ic = 0; ic < Cg; ++ic)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                const int64_t ih = oh * o.stride[0] - o.padding[0] + ki * o.dilation[0];
                const int64_t iw = ow * o.stride[1] - o.padding[1] + kj * o.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += at(x, {n, group * Cg + ic, ih, iw}) * at(w, {oc, ic, ki, kj});
              }
          out.push_back(s);
        }
  return tensor_of(out, {N, O, OH, OW}, DType::f64);
}

const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> all = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {.padding = {1, 1}}, true},
      {{1, 3, 7, 6}, {4, 3, 3, 3}, {}, false},  // one image: GEMM threads
      {{3, 2, 9, 8}, {5, 2, 3, 2}, {.stride = {2, 1}, .padding = {0, 2}}, true},
      {{2, 2, 9, 9},
       {3, 2, 3, 3},
       {.stride = {2, 3}, .padding = {1, 2}, .dilation = {2, 1}},
       false},
      {{2, 4, 8, 7}, {6, 2, 3, 3}, {.padding = {1, 1}, .groups = 2}, true},
      {{2, 6, 6, 6}, {3, 2, 2, 2}, {.stride = {2, 2}, .groups = 3}, false},
      {{2, 4, 7, 7}, {4, 1, 3, 3}, {.padding = {1, 1}, .groups = 4}, true},  // depthwise
      {{2, 3, 8, 7},
       {6, 1, 3, 2},
       {.stride = {2, 2}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 3},
       false},
      {{1, 2, 5, 5}, {2, 1, 3, 3}, {.stride = {1, 2}, .padding = {2, 2}, .groups = 2}, true},
      {{2, 5, 4, 6}, {3, 5, 1, 1}, {}, true},                   // pointwise: no im2col
      {{2, 5, 5, 6}, {3, 5, 1, 1}, {.stride = {2, 2}}, false},  // 1x1 strided
      {{2, 4, 4, 5}, {4, 2, 1, 1}, {.groups = 2}, false},       // grouped pointwise
      {{2, 2, 3, 3}, {3, 2, 5, 5}, {.padding = {1, 1}}, true},  // kernel fills the padded input
      {{3, 3, 5, 5}, {2, 3, 3, 3}, {.dilation = {2, 2}}, true},
      // Taps that only ever read padding (the kernels run the live ones alone):
      {{2, 3, 1, 1}, {4, 3, 3, 3}, {.padding = {1, 1}}, true},                        // the centre
      {{2, 3, 2, 2}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, false},     // the last 2x2
      {{1, 2, 1, 4}, {3, 2, 3, 3}, {.padding = {1, 1}}, true},                        // rows only
      {{2, 2, 2, 2}, {3, 2, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}}, false},   // dilated
      {{2, 4, 1, 1}, {4, 2, 3, 3}, {.padding = {1, 1}, .groups = 2}, true},           // grouped
  };
  return all;
}

Tensor maybe_bias(const ConvCase& c, DType dtype) {
  return c.bias ? randn({c.weight[0]}, {.dtype = dtype}) : Tensor();
}

double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

}  // namespace

TEST_CASE("conv2d: against a naive loop over stride / padding / dilation and groups", "[conv]") {
  const auto dtype = GENERATE(DType::f32, DType::f64);
  for (const ConvCase& c : cases()) {
    INFO(describe(c) << " in " << name(dtype));
    const Tensor x = randn(c.input, {.dtype = dtype}), w = randn(c.weight, {.dtype = dtype});
    const Tensor b = maybe_bias(c, dtype);
    const Tensor expected = naive_conv2d(x, w, b, c.options);
    const Tensor y = conv2d(x, w, b, c.options);
    CHECK(y.dtype() == dtype);
    // Sums of at most ~50 products of N(0,1) values: 1e-5 relative and absolute in f32.
    const double t = dtype == DType::f32 ? 1e-5 : 1e-12;
    KILN_CHECK_CLOSE(y, expected, t, t);
    // non-contiguous input and weight: every other element, channels-last, transposed planes
    const Tensor channels_last = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    KILN_CHECK_CLOSE(conv2d(strided_copy(x), strided_copy(w), b, c.options), expected, t, t);
    KILN_CHECK_CLOSE(conv2d(channels_last, transposed_copy(w), b, c.options), expected, t, t);
    KILN_CHECK_CLOSE(conv2d(transposed_copy(x), w, b, c.options), expected, t, t);
  }
}

TEST_CASE("conv2d: f16 and bf16 compute in f32", "[conv]") {
  const auto dtype = GENERATE(DType::f16, DType::bf16);
  for (const size_t i : {0, 4, 6, 9}) {
    const ConvCase& c = cases()[i];
    INFO(describe(c) << " in " << name(dtype));
    const Tensor x = randn(c.input).to(dtype), w = randn(c.weight).to(dtype);
    const Tensor b = c.bias ? randn({c.weight[0]}).to(dtype) : Tensor();
    const Tensor y = conv2d(x, w, b, c.options);
    CHECK(y.dtype() == dtype);
    // The reference sums the rounded inputs exactly; sums of up to 28 terms of size ~1 make
    // the one rounding at the end worth up to tol(dtype) * |sum| + a few ulps of 1.
    KILN_CHECK_CLOSE(y, naive_conv2d(x, w, b, c.options), tol(dtype) * 2, tol(dtype) * 4);
  }
}

TEST_CASE("conv2d: both GEMM backends give the same result", "[conv]") {
  if (!cpu::gemm_blas_available()) return;
  const ConvCase& c = cases()[2];
  const Tensor x = randn(c.input, {.dtype = DType::f64}),
               w = randn(c.weight, {.dtype = DType::f64});
  const cpu::GemmBackend previous = cpu::gemm_backend();
  cpu::set_gemm_backend(cpu::GemmBackend::eigen);
  const Tensor with_eigen = conv2d(x, w, {}, c.options);
  cpu::set_gemm_backend(cpu::GemmBackend::blas);
  const Tensor with_blas = conv2d(x, w, {}, c.options);
  cpu::set_gemm_backend(previous);
  KILN_CHECK_CLOSE(with_eigen, with_blas, 1e-12, 1e-12);
}

TEST_CASE("conv2d gradients: adjoint identities in f64", "[conv]") {
  for (const ConvCase& c : cases()) {
    INFO(describe(c));
    const Tensor x = randn(c.input, {.dtype = DType::f64}),
                 w = randn(c.weight, {.dtype = DType::f64});
    const Tensor y = conv2d(x, w, {}, c.options);
    const Tensor g = randn(y.shape(), {.dtype = DType::f64});
    const Tensor gx = conv2d_backward_input(g, w, c.input, c.options);
    const Tensor gw = conv2d_backward_weight(g, x, c.weight, c.options);
    REQUIRE(gx.shape() == c.input);
    REQUIRE(gw.shape() == c.weight);
    // conv is linear in x and in w: <conv(x, w), g> is <x, gx> and <w, gw>. With random x,
    // w and g a wrong gradient entry shows up here almost surely.
    const double forward = dot(y, g);
    const double scale = std::max(1.0, std::abs(forward));
    CHECK(std::abs(dot(x, gx) - forward) <= 1e-10 * scale);
    CHECK(std::abs(dot(w, gw) - forward) <= 1e-10 * scale);
    // Strided gradients give the same result, and f32 agrees with f64.
    KILN_CHECK_CLOSE(conv2d_backward_input(strided_copy(g), transposed_copy(w), c.input, c.options),
                     gx, 1e-12, 1e-12);
    KILN_CHECK_CLOSE(conv2d_backward_weight(g, strided_copy(x), c.weight, c.options), gw, 1e-12,
                     1e-12);
    KILN_CHECK_CLOSE(conv2d_backward_input(g.to(DType::f32), w.to(DType::f32), c.input, c.options),
                     gx, 1e-5, 1e-4);
    KILN_CHECK_CLOSE(
        conv2d_backward_weight(g.to(DType::f32), x.to(DType::f32), c.weight, c.options), gw, 1e-5,
        1e-4);
  }
}

TEST_CASE("conv2d gradients: against naive loops on one case", "[conv]") {
  // A second, direct check: each gradient entry is the derivative of sum(conv * g), read
  // off by convolving unit tensors (small shapes only).
  const ConvCase c{
      {1, 2, 4, 5}, {2, 1, 2, 3}, {.stride = {2, 1}, .padding = {1, 1}, .groups = 2}, false};
  const Tensor x = randn(c.input, {.dtype = DType::f64}),
               w = randn(c.weight, {.dtype = DType::f64});
  const Tensor g = randn(conv2d(x, w, {}, c.options).shape(), {.dtype = DType::f64});
  const Tensor gx = conv2d_backward_input(g, w, c.input, c.options);
  std::vector<double> expected;
  for_each_index(c.input, [&](const std::vector<int64_t>& idx) {
    Tensor e = zeros(c.input, {.dtype = DType::f64});
    e[idx[0]][idx[1]][idx[2]][idx[3]].fill_(1.0);
    expected.push_back(dot(naive_conv2d(e, w, {}, c.options), g));
  });
  KILN_CHECK_CLOSE(gx, tensor_of(expected, c.input, DType::f64), 1e-12, 1e-12);
  const Tensor gw = conv2d_backward_weight(g, x, c.weight, c.options);
  expected.clear();
  for_each_index(c.weight, [&](const std::vector<int64_t>& idx) {
    Tensor e = zeros(c.weight, {.dtype = DType::f64});
    e[idx[0]][idx[1]][idx[2]][idx[3]].fill_(1.0);
    expected.push_back(dot(naive_conv2d(x, e, {}, c.options), g));
  });
  KILN_CHECK_CLOSE(gw, tensor_of(expected, c.weight, DType::f64), 1e-12, 1e-12);
}

TEST_CASE("conv2d: bad input throws errors naming conv2d and the shapes", "[conv]") {
  const Tensor x = zeros({1, 6, 8, 8});
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 4, 3, 3})),
                    Catch::Contains("conv2d: input [1,6,8,8] and weight [4,4,3,3]") &&
                        Catch::Contains("channel mismatch"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 1, 3, 3}), {}, {.groups = 4}),
                    Catch::Contains("conv2d: input [1,6,8,8] and weight [4,1,3,3]") &&
                        Catch::Contains("groups 4 does not divide the 6 input channels"));
  CHECK_THROWS_WITH(conv2d(x, zeros({5, 3, 3, 3}), {}, {.groups = 2}),
                    Catch::Contains("groups 2 does not divide the 5 output channels"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 11, 3})),
                    Catch::Contains("conv2d: input [1,6,8,8] and weight [4,6,11,3]") &&
                        Catch::Contains("larger than the padded input"));
  CHECK_NOTHROW(conv2d(x, zeros({4, 6, 10, 3}), {}, {.padding = {1, 0}}));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 5, 5}), {}, {.dilation = {2, 2}}),
                    Catch::Contains("larger than the padded input"));
  CHECK_THROWS_WITH(
      conv2d(zeros({6, 8, 8}), zeros({4, 6, 3, 3})),
      Catch::Contains("conv2d: input [6,8,8] and weight [4,6,3,3]") && Catch::Contains("4-d"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3})),
                    Catch::Contains("conv2d") && Catch::Contains("4-d"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}), zeros({5})),
                    Catch::Contains("conv2d") && Catch::Contains("bias [5]"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}), {}, {.stride = {0, 1}}),
                    Catch::Contains("conv2d") && Catch::Contains("stride"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}, {.dtype = DType::f64})),
                    Catch::Contains("conv2d") && Catch::Contains("dtypes differ"));
  CHECK_THROWS_WITH(conv2d(zeros({1, 6, 8, 8}, {.dtype = DType::i64}),
                           zeros({4, 6, 3, 3}, {.dtype = DType::i64})),
                    Catch::Contains("conv2d") && Catch::Contains("i64"));
  CHECK_THROWS_WITH(
      conv2d_backward_input(zeros({1, 4, 5, 5}), zeros({4, 6, 3, 3}), {1, 6, 8, 8}),
      Catch::Contains("conv2d_backward_input: grad_out [1,4,5,5]") && Catch::Contains("[1,4,6,6]"));
  CHECK_THROWS_WITH(
      conv2d_backward_weight(zeros({1, 4, 6, 6}), x, {4, 5, 3, 3}),
      Catch::Contains("conv2d_backward_weight: input [1,6,8,8] and weight [4,5,3,3]"));
}
