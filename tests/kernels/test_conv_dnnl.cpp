// conv2d and its gradients through oneDNN against kiln's own kernels (themselves checked
// against naive loops in test_conv.cpp), on NCHW and NHWC activations, f32 and bf16, with
// and without a gradient to add to; the backend switch; and the weight gradient's taps
// that only read padding. Tolerances are the error bound of two f32 sums of the same
// products in different orders, from the sums of the products' magnitudes.
#include <cmath>
#include <thread>

#include "core/ops/conv.h"
#include "kernels/cpu/conv_dnnl.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct BackendScope {
  cpu::ConvBackend previous = cpu::conv_backend();
  explicit BackendScope(cpu::ConvBackend b) { cpu::set_conv_backend(b); }
  ~BackendScope() { cpu::set_conv_backend(previous); }
};

struct DnnlCase {
  const char* what;
  Shape input, weight;
  Conv2dOptions options;
};

const std::vector<DnnlCase>& dnnl_cases() {
  static const std::vector<DnnlCase> all = {
      {"3x3 pad 1", {3, 16, 6, 5}, {32, 16, 3, 3}, {.padding = {1, 1}}},
      {"3x3 stride 2", {2, 24, 7, 7}, {16, 24, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"1x1", {4, 32, 3, 3}, {48, 32, 1, 1}, {}},
      {"1x1 stride 2", {2, 16, 5, 6}, {8, 16, 1, 1}, {.stride = {2, 2}}},
      {"7x7 stem", {2, 3, 12, 11}, {16, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
      {"channels off the vector width", {2, 5, 6, 7}, {7, 5, 3, 3}, {.padding = {1, 1}}},
      {"asymmetric", {2, 8, 9, 6}, {8, 8, 3, 2}, {.stride = {2, 1}, .padding = {0, 2}}},
      {"dilated", {2, 8, 8, 7}, {16, 8, 3, 3}, {.padding = {2, 1}, .dilation = {2, 1}}},
      {"grouped", {2, 16, 6, 6}, {32, 8, 3, 3}, {.padding = {1, 1}, .groups = 2}},
      {"depthwise", {2, 16, 7, 7}, {16, 1, 3, 3}, {.padding = {1, 1}, .groups = 16}},
      {"1x1 planes", {8, 32, 1, 1}, {16, 32, 3, 3}, {.padding = {1, 1}}},
      {"2x2 planes stride 2", {4, 16, 2, 2}, {32, 16, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
  };
  return all;
}

// conv2d and both gradients of one case, in `dtype`, x and grad_out in `format`, the weight
// gradient added to `added` when defined.
struct Results {
  Tensor y, gx, gw;
};
Results run(const DnnlCase& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g,
            const Tensor& added) {
  return {conv2d(x, w, b, c.options), conv2d_backward_input(g, w, c.input, c.options),
          conv2d_backward_weight(g, x, c.weight, c.options, added)};
}

// |a - b| <= rel * magnitude elementwise, where magnitude is the same sum over the
// products' absolute values (computed in f64). A bf16 result adds its roundings to bf16,
// each within 2^-9 of a value no larger than the magnitude, at most three of them between
// the two sides (a sum rounded, then added to a gradient and rounded again): 2^-7.
void check_within(const Tensor& a, const Tensor& b, const Tensor& magnitude, double rel, bool bf16_result) {
  const std::vector<double> va = values(a), vb = values(b), vm = values(magnitude);
  REQUIRE(va.size() == vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    const double bound = (rel + (bf16_result ? std::ldexp(1.0, -7) : 0.0)) * vm[i];
    if (std::abs(va[i] - vb[i]) > bound) {
      FAIL_CHECK("element " << i << ": " << va[i] << " against " << vb[i] << ", bound " << bound);
      return;
    }
  }
}

// gamma_n = n u / (1 - n u), u = 2^-24: the relative bound of an f32 sum of n terms
// against their magnitude; two sums in different orders differ by at most twice that.
double two_sums(int64_t terms) {
  const double nu = static_cast<double>(terms) * std::ldexp(1.0, -24);
  return 2 * nu / (1 - nu);
}

}  // namespace

TEST_CASE("conv2d through oneDNN equals kiln's kernels", "[conv][dnnl]") {
  if (!cpu::conv_dnnl_available()) {
    WARN("this build has no oneDNN");
    return;
  }
  const auto dtype = GENERATE(DType::f32, DType::bf16);
  const auto format = GENERATE(MemoryFormat::contiguous, MemoryFormat::channels_last);
  const bool accumulate = GENERATE(false, true);
  for (const DnnlCase& c : dnnl_cases()) {
    INFO(c.what << " in " << name(dtype) << (format == MemoryFormat::channels_last ? " NHWC" : " NCHW")
                << (accumulate ? " adding to a gradient" : ""));
    const Tensor x = randn(c.input).to(dtype).contiguous(format), w = randn(c.weight).to(dtype);
    const Tensor b = randn({c.weight[0]}).to(dtype);
    const Shape out_shape = conv2d(x, w, b, c.options).shape();
    const Tensor g = randn(out_shape).to(dtype).contiguous(format);
    const Tensor added = accumulate ? randn(c.weight).to(dtype) : Tensor();
    Results own, dnnl;
    {
      BackendScope scope(cpu::ConvBackend::own);
      own = run(c, x, w, b, g, added);
    }
    {
      BackendScope scope(cpu::ConvBackend::dnnl);
      const int64_t calls = cpu::dnnl_calls();
      dnnl = run(c, x, w, b, g, added);
      // f32 has a JIT kernel on every x86-64 CPU with SSE4.1; bf16 may fall back.
      if (dtype == DType::f32) CHECK(cpu::dnnl_calls() == calls + 3);
    }
    // Same layouts either way: outputs follow the activation they come from (grad_out for
    // the input's gradient: of 1x1 planes, that is NCHW), weight gradients contiguous.
    CHECK(dnnl.y.is_contiguous(format));
    CHECK(dnnl.gx.is_contiguous(g.suggest_memory_format()));
    CHECK(own.gx.is_contiguous(g.suggest_memory_format()));
    CHECK(dnnl.gw.is_contiguous());
    CHECK(dnnl.y.dtype() == dtype);
    CHECK(dnnl.gw.dtype() == dtype);
    // Magnitudes: the same sums over absolute values in f64 (kiln's f64 kernels).
    const Tensor ax = abs(x.to(DType::f64)), aw = abs(w.to(DType::f64)), ag = abs(g.to(DType::f64));
    const Conv2dOptions& o = c.options;
    const int64_t taps = c.weight[2] * c.weight[3];
    const int64_t out_plane = out_shape[2] * out_shape[3];
    const bool bf16 = dtype == DType::bf16;
    const Tensor my = conv2d(ax, aw, abs(b.to(DType::f64)), o);
    check_within(dnnl.y, own.y, my, two_sums(c.weight[1] * taps + 1), bf16);
    const Tensor mgx = conv2d_backward_input(ag, aw, c.input, o);
    check_within(dnnl.gx, own.gx, mgx, two_sums(c.weight[0] / o.groups * taps), bf16);
    Tensor mgw = conv2d_backward_weight(ag, ax, c.weight, o);
    if (accumulate) mgw = mgw + abs(added.to(DType::f64));
    check_within(dnnl.gw, own.gw, mgw, two_sums(c.input[0] * out_plane + 1), bf16);
  }
}

TEST_CASE("conv2d: the backend switch", "[conv][dnnl]") {
  const DnnlCase c = dnnl_cases()[0];
  const Tensor x = randn(c.input), w = randn(c.weight);
  {
    BackendScope scope(cpu::ConvBackend::own);
    const int64_t calls = cpu::dnnl_calls();
    (void)conv2d(x, w, {}, c.options);
    CHECK(cpu::dnnl_calls() == calls);
  }
  if (!cpu::conv_dnnl_available()) {
    CHECK_THROWS_WITH(cpu::set_conv_backend(cpu::ConvBackend::dnnl), Catch::Contains("no oneDNN"));
    CHECK(cpu::conv_backend() == cpu::ConvBackend::own);
    return;
  }
  BackendScope scope(cpu::ConvBackend::automatic);
  const int64_t calls = cpu::dnnl_calls();
  (void)conv2d(x, w, {}, c.options);  // NCHW 3x3: oneDNN's
  CHECK(cpu::dnnl_calls() == calls + 1);
  CHECK(std::string(cpu::dnnl_last_implementation()).rfind("ref", 0) != 0);
  // f64 has no oneDNN kernel: kiln's run it.
  (void)conv2d(x.to(DType::f64), w.to(DType::f64), {}, c.options);
  CHECK(cpu::dnnl_calls() == calls + 1);
}

TEST_CASE("conv2d_backward_weight: taps that only read padding get zero, or keep what is added", "[conv]") {
  // 3x3, padding 1, over 1x1 planes: only the centre tap reads the image.
  const Conv2dOptions o{.padding = {1, 1}};
  const auto backend = GENERATE(cpu::ConvBackend::own, cpu::ConvBackend::automatic);
  if (backend != cpu::ConvBackend::own && !cpu::conv_dnnl_available()) return;
  BackendScope scope(backend);
  const Tensor x = randn({4, 6, 1, 1}), g = randn({4, 5, 1, 1});
  const Tensor gw = conv2d_backward_weight(g, x, {5, 6, 3, 3}, o);
  // The centre is the 1x1 convolution's gradient: sum over images of g[n, o] x[n, c].
  const Tensor centre = matmul(g.reshape({4, 5}).transpose(0, 1), x.reshape({4, 6}));
  KILN_CHECK_CLOSE(gw.slice(2, 1, 2).slice(3, 1, 2).reshape({5, 6}), centre, 1e-6, 1e-6);
  Tensor ring = gw.clone();
  ring.slice(2, 1, 2).slice(3, 1, 2).zero_();
  KILN_CHECK_EQUAL(ring, zeros({5, 6, 3, 3}));
  // Added to a gradient: the cut taps keep it, the centre gets it plus the sum.
  const Tensor added = randn({5, 6, 3, 3});
  const Tensor sum = conv2d_backward_weight(g, x, {5, 6, 3, 3}, o, added);
  KILN_CHECK_CLOSE(sum, added + gw, 1e-6, 1e-6);
  Tensor outside = sum - added;
  outside.slice(2, 1, 2).slice(3, 1, 2).zero_();
  KILN_CHECK_EQUAL(outside, zeros({5, 6, 3, 3}));
}

TEST_CASE("conv2d through oneDNN: two threads may run the same convolution at once", "[conv][dnnl]") {
  if (!cpu::conv_dnnl_available()) return;
  BackendScope scope(cpu::ConvBackend::dnnl);
  const DnnlCase c = dnnl_cases()[1];
  const Tensor x = randn(c.input), w = randn(c.weight);
  const Tensor y = conv2d(x, w, {}, c.options), g = randn(y.shape());
  const Tensor gw = conv2d_backward_weight(g, x, c.weight, c.options);
  // Each thread repeats the same calls; every result equals the first one, bit for bit
  // (each call has its own scratch memory).
  std::vector<int> mismatches(2, 0);
  auto work = [&](int t) {
    for (int i = 0; i < 20; ++i) {
      if (!allclose(conv2d(x, w, {}, c.options), y, 0, 0)) ++mismatches[static_cast<size_t>(t)];
      if (!allclose(conv2d_backward_weight(g, x, c.weight, c.options), gw, 0, 0)) ++mismatches[static_cast<size_t>(t)];
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  CHECK(mismatches == std::vector<int>{0, 0});
}
