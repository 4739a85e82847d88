// The cuDNN-backed CUDA kernels (kernels/cuda/conv.cpp, norm.cpp, pool.cpp) against the CPU
// kernels of the same ops: conv2d and its gradients, batch norm (train, eval, the running
// statistics' update, backward), max/avg/adaptive pooling and their gradients, a small
// ConvNet's forward and backward, and the convolutions with cudnn benchmark mode on (timed
// algorithm choice, searched once per shape). Tolerances (relative and absolute): f32 1e-4
// (TF32 off, the default), f64 1e-10, f16 2e-2; the ConvNet 1e-3.
#include <limits>
#include <optional>

#include "cuda/cuda_testing.h"
#ifdef KILN_HAVE_CUDNN
#include "kernels/cuda/cudnn.h"
#endif

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::values_in;

namespace {


double tolerance(DType dt) { return dt == DType::f64 ? 1e-10 : dt == DType::f16 ? 2e-2 : 1e-4; }

// The same memory order as channels_last: NHWC storage of an NCHW-shaped tensor.
Tensor channels_last(const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}); }

// Runs f on the CPU inputs and on their GPU copies (through `layout` on the GPU side) and
// compares every output.
void check_same(const std::string& what, const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& inputs, double tol, const std::function<Tensor(const Tensor&)>& layout = {}) {
  INFO(what);
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) {
    Tensor g = t.defined() ? gpu(t) : Tensor();
    if (g.defined() && layout && g.dim() == 4) g = layout(g);
    on_gpu.push_back(g);
  }
  const std::vector<Tensor> expected = f(inputs), actual = f(on_gpu);
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("output " << i);
    CHECK(actual[i].device() == Device::cuda(0));
    CHECK(actual[i].dtype() == expected[i].dtype());
    KILN_CHECK_CLOSE(host(actual[i]), expected[i], tol, tol);
  }
}

struct ConvCase {
  const char* name;
  Shape input, weight;
  Conv2dOptions options;
};

const std::vector<ConvCase> kConvCases = {
    {"stem 7x7 stride 2 pad 3", {2, 3, 16, 16}, {8, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
    {"3x3 pad 1", {2, 8, 8, 8}, {8, 8, 3, 3}, {.padding = {1, 1}}},
    {"3x3 stride 2 pad 1", {2, 8, 9, 9}, {16, 8, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
    {"1x1", {2, 16, 5, 5}, {8, 16, 1, 1}, {}},
    {"1x1 stride 2 downsample", {2, 8, 8, 8}, {16, 8, 1, 1}, {.stride = {2, 2}}},
    {"groups 2", {2, 8, 6, 6}, {6, 4, 3, 3}, {.padding = {1, 1}, .groups = 2}},
    {"depthwise", {2, 6, 7, 7}, {6, 1, 3, 3}, {.padding = {1, 1}, .groups = 6}},
    {"dilation 2 rectangular", {1, 4, 9, 11}, {5, 4, 3, 2}, {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 2}}},
};

// conv2d with and without bias, and both gradients.
std::vector<Tensor> conv_all(const std::vector<Tensor>& in, const ConvCase& c) {
  const Tensor &x = in[0], &w = in[1], &b = in[2], &gy = in[3];
  return {conv2d(x, w, b, c.options), conv2d(x, w, {}, c.options),
          conv2d_backward_input(gy, w, c.input, c.options), conv2d_backward_weight(gy, x, c.weight, c.options)};
}

void check_conv_cases(DType dt, const std::string& layout_name, const std::function<Tensor(const Tensor&)>& layout) {
  for (const ConvCase& c : kConvCases) {
    const Tensor x = values_in(c.input, -1, 1, dt, 1), w = values_in(c.weight, -1, 1, dt, 2);
    const Tensor b = values_in({c.weight[0]}, -1, 1, dt, 3);
    const Tensor y = conv2d(x, w, b, c.options);
    const Tensor gy = values_in(y.shape(), -1, 1, dt, 4);
    check_same(fmt::format("{} {} {}", c.name, dt, layout_name), [&](auto& in) { return conv_all(in, c); },
               {x, w, b, gy}, tolerance(dt), layout);
  }
}

}  // namespace

TEST_CASE("cuDNN kernels are registered and need a GPU", "[cuda][cudnn]") {
#ifdef KILN_HAVE_CUDNN
  for (const char* op : {"conv2d", "conv2d_backward_input", "conv2d_backward_weight", "batch_norm",
                         "batch_norm_backward", "batch_norm_stats_update", "batch_norm_update", "max_pool2d", "max_pool2d_backward",
                         "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"}) {
    INFO(op);
    CHECK(find_op(op).kernels[static_cast<size_t>(DeviceType::cuda)] != nullptr);
  }
#else
  WARN("this build has no cuDNN: the ops have no CUDA kernels");
#endif
  if (cuda::is_available()) return;
  const Tensor x = ones({1, 3, 8, 8}), w = ones({4, 3, 3, 3});
  CHECK_THROWS_WITH(conv2d(gpu(x), gpu(w)), Catch::Contains("not available"));
  CHECK_THROWS_AS(max_pool2d(gpu(x), {2}), Error);
}

TEST_CASE("conv2d and its gradients on the GPU equal the CPU", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16}) check_conv_cases(dt, "contiguous", {});
}

TEST_CASE("conv2d on the GPU takes channels-last and strided inputs", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  check_conv_cases(DType::f32, "channels-last", channels_last);
  check_conv_cases(DType::f32, "strided", [](const Tensor& t) { return t.slice(3, 0, t.size(3)).transpose(2, 3).contiguous().transpose(2, 3); });
  // A sliced input (every other column of a wider tensor).
  const Tensor wide = values_in({2, 4, 6, 12}, -1, 1, DType::f32), w = values_in({5, 4, 3, 3}, -1, 1, DType::f32);
  check_same("sliced input", [](auto& in) { return std::vector<Tensor>{conv2d(in[0].slice(3, 0, 12, 2), in[1])}; },
             {wide, w}, 1e-4);
  // bf16: runs on tensor cores, close to the CPU in bf16's precision.
  const Tensor xb = values_in({2, 8, 8, 8}, -1, 1, DType::bf16), wb = values_in({8, 8, 3, 3}, -1, 1, DType::bf16);
  check_same("bf16", [](auto& in) { return std::vector<Tensor>{conv2d(in[0], in[1], {}, {.padding = {1, 1}})}; },
             {xb, wb}, 5e-2);
}

TEST_CASE("conv2d on the GPU uses TF32 only when allowed", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  const Tensor x = values_in({2, 32, 8, 8}, -1, 1, DType::f32), w = values_in({32, 32, 3, 3}, -1, 1, DType::f32);
  const Tensor expected = conv2d(x, w, {}, {.padding = {1, 1}});
  cuda::set_allow_tf32(true);
  const Tensor tf32 = host(conv2d(gpu(x), gpu(w), {}, {.padding = {1, 1}}));
  cuda::set_allow_tf32(false);
  KILN_CHECK_CLOSE(tf32, expected, 1e-2, 1e-2);
  KILN_CHECK_CLOSE(host(conv2d(gpu(x), gpu(w), {}, {.padding = {1, 1}})), expected, 1e-4, 1e-4);
}

TEST_CASE("batch_norm on the GPU equals the CPU in training and eval", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    for (const Shape& shape : {Shape{4, 6, 5, 5}, Shape{8, 6}, Shape{3, 6, 7}}) {
      const std::string what = fmt::format("{} {}", dt, shape_str(shape));
      const Tensor x = values_in(shape, -2, 3, dt, 5);
      const DType pd = dt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor w = values_in({6}, 0.5, 1.5, pd, 6), b = values_in({6}, -1, 1, pd, 7);
      const Tensor rm = values_in({6}, -0.5, 0.5, pd, 8), rv = values_in({6}, 0.5, 2, pd, 9);
      const double tol = tolerance(dt);
      // Training: the output, the saved statistics and the running statistics updated in place.
      check_same("train " + what, [](auto& in) {
        Tensor m = in[3].clone(), v = in[4].clone();
        BatchNormResult r = batch_norm_with_stats(in[0], in[1], in[2], m, v, true, 0.1, 1e-5);
        return std::vector<Tensor>{r.output, r.save_mean, r.save_invstd, m, v};
      }, {x, w, b, rm, rv}, tol);
      check_same("train without affine or running stats " + what, [](auto& in) {
        BatchNormResult r = batch_norm_with_stats(in[0], {}, {}, {}, {}, true, 0.1, 1e-3);
        return std::vector<Tensor>{r.output, r.save_mean, r.save_invstd};
      }, {x}, tol);
      check_same("eval " + what, [](auto& in) {
        BatchNormResult r = batch_norm_with_stats(in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5);
        return std::vector<Tensor>{r.output, r.save_mean, r.save_invstd};
      }, {x, w, b, rm, rv}, tol);
      check_same("stats update " + what, [](auto& in) {
        RunningStats s = batch_norm_stats_update(in[0], in[1], in[2], 0.3);
        return std::vector<Tensor>{s.mean, s.var, in[1], in[2]};  // the arguments stay unchanged
      }, {x, rm, rv}, tol);
      check_same("batch_norm_update " + what, [](auto& in) {
        std::vector<Tensor> out = call_op(find_op("batch_norm_update"), {in[0], in[1], in[2], in[3], in[4]},
                                          {{"training", true}, {"momentum", 0.3}, {"eps", 1e-5}});
        out.push_back(in[3]);  // the arguments stay unchanged
        out.push_back(in[4]);
        return out;
      }, {x, w, b, rm, rv}, tol);
      const Tensor gy = values_in(shape, -1, 1, dt, 10);
      for (bool training : {true, false}) {
        check_same(fmt::format("backward training={} {}", training, what), [training](auto& in) {
          const BatchNormResult r = batch_norm_with_stats(in[1], in[2], {}, in[3], in[4], training, 0.1, 1e-5);
          NormGrads g = batch_norm_backward(in[0], in[1], in[2], r.save_mean, r.save_invstd, training, 1e-5);
          NormGrads g_no_weight = batch_norm_backward(in[0], in[1], {}, r.save_mean, r.save_invstd, training, 1e-5);
          return std::vector<Tensor>{g.grad_input, g.grad_weight, g.grad_bias, g_no_weight.grad_weight};
        }, {gy, x, w, rm.clone(), rv.clone()}, tol);
      }
    }
  }
  // The running statistics in f16 (another dtype than the statistics'), updated through copies.
  const Tensor x = values_in({4, 3, 4, 4}, -1, 1, DType::f32, 11);
  check_same("f16 running stats", [](auto& in) {
    Tensor m = in[1].clone(), v = in[2].clone();
    batch_norm(in[0], {}, {}, m, v, true, 0.2);
    return std::vector<Tensor>{m, v};
  }, {x, zeros({3}, {.dtype = DType::f16}), ones({3}, {.dtype = DType::f16})}, 2e-3);
}

TEST_CASE("batch_norm on the GPU keeps channels-last data NHWC and equals the CPU", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  // The GPU side gets its 4-d inputs channels_last (NHWC descriptors, the persistent mode in
  // training); the CPU side computes NCHW. Outputs follow the input's layout on the GPU.
  for (DType dt : {DType::f32, DType::f16}) {
    const Shape shape{4, 6, 5, 3};
    const std::string what = fmt::format("{} {}", dt, shape_str(shape));
    const Tensor x = values_in(shape, -2, 3, dt, 5), gy = values_in(shape, -1, 1, dt, 10);
    const Tensor w = values_in({6}, 0.5, 1.5, DType::f32, 6), b = values_in({6}, -1, 1, DType::f32, 7);
    const Tensor rm = values_in({6}, -0.5, 0.5, DType::f32, 8), rv = values_in({6}, 0.5, 2, DType::f32, 9);
    const double tol = tolerance(dt);
    check_same("train NHWC " + what, [](auto& in) {
      Tensor m = in[3].clone(), v = in[4].clone();
      BatchNormResult r = batch_norm_with_stats(in[0], in[1], in[2], m, v, true, 0.1, 1e-5);
      if (in[0].device().is_cuda()) CHECK(r.output.is_contiguous(MemoryFormat::channels_last));
      return std::vector<Tensor>{r.output, r.save_mean, r.save_invstd, m, v};
    }, {x, w, b, rm, rv}, tol, channels_last);
    check_same("eval NHWC " + what, [](auto& in) {
      BatchNormResult r = batch_norm_with_stats(in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5);
      return std::vector<Tensor>{r.output, r.save_mean, r.save_invstd};
    }, {x, w, b, rm, rv}, tol, channels_last);
    check_same("stats update NHWC " + what, [](auto& in) {
      RunningStats st = batch_norm_stats_update(in[0], in[1], in[2], 0.3);
      return std::vector<Tensor>{st.mean, st.var};
    }, {x, rm, rv}, tol, channels_last);
    for (bool training : {true, false})
      check_same(fmt::format("backward NHWC training={} {}", training, what), [training](auto& in) {
        const BatchNormResult r = batch_norm_with_stats(in[1], in[2], {}, in[3], in[4], training, 0.1, 1e-5);
        NormGrads g = batch_norm_backward(in[0], in[1], in[2], r.save_mean, r.save_invstd, training, 1e-5);
        if (in[0].device().is_cuda() && training) CHECK(g.grad_input.is_contiguous(MemoryFormat::channels_last));
        return std::vector<Tensor>{g.grad_input, g.grad_weight, g.grad_bias};
      }, {gy, x, w, rm.clone(), rv.clone()}, tol, channels_last);
  }
  // Mixed layouts: an NHWC input with a contiguous gradient (copied into the input's layout).
  const Tensor x = values_in({2, 3, 4, 4}, -1, 1, DType::f32, 11), gy = values_in({2, 3, 4, 4}, -1, 1, DType::f32, 12);
  check_same("backward NHWC input, NCHW gradient", [](auto& in) {
    const Tensor xin = in[1].device().is_cuda() ? channels_last(in[1]) : in[1];
    const BatchNormResult r = batch_norm_with_stats(xin, {}, {}, {}, {}, true, 0.1, 1e-5);
    return std::vector<Tensor>{batch_norm_backward(in[0], xin, {}, r.save_mean, r.save_invstd, true, 1e-5).grad_input};
  }, {gy, x}, 1e-4);
}

TEST_CASE("max_pool2d on the GPU gives the CPU's values and indices", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    // Small integers repeat within every window: ties must pick the first maximum.
    const Tensor ties = testing::small_integers({2, 4, 9, 9}, dt);
    const Tensor x = values_in({2, 3, 11, 10}, -1, 1, dt, 12);
    auto pool = [](const Tensor& t, std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
                   std::vector<int64_t> d, bool ceil) {
      const MaxPool2dResult r = max_pool2d_with_indices(t, k, s, p, d, ceil);
      const Tensor grad = ones(r.values.shape(), {.dtype = t.dtype(), .device = t.device()}) * 0.5;
      return std::vector<Tensor>{r.values, r.indices, max_pool2d_backward(grad, r.indices, t.shape())};
    };
    for (const Tensor& t : {ties, x}) {
      check_same(fmt::format("resnet 3x3 s2 p1 {}", dt), [&](auto& in) { return pool(in[0], {3}, {2}, {1}, {1}, false); }, {t}, 0);
      check_same(fmt::format("2x2 {}", dt), [&](auto& in) { return pool(in[0], {2}, {}, {0}, {1}, false); }, {t}, 0);
      check_same(fmt::format("dilation ceil {}", dt), [&](auto& in) { return pool(in[0], {3, 2}, {2, 1}, {1, 0}, {2, 1}, true); }, {t}, 0);
      check_same(fmt::format("3-d {}", dt), [&](auto& in) { return pool(in[0][1], {3}, {2}, {1}, {1}, false); }, {t}, 0);
    }
  }
  // Channels-last input is pooled as it is (the NHWC kernels), into channels-last outputs;
  // the gradient comes back channels-last too.
  const Tensor nhwc = testing::small_integers({2, 5, 9, 8}, DType::f32);
  check_same("channels_last 3x3 s2 p1", [](auto& in) {
    const Tensor t = channels_last(in[0]);
    const MaxPool2dResult r = max_pool2d_with_indices(t, {3}, {2}, {1});
    CHECK(r.values.is_contiguous(MemoryFormat::channels_last));
    const Tensor grad = channels_last(ones(r.values.shape(), {.dtype = t.dtype(), .device = t.device()}) * 0.5);
    const Tensor dx = max_pool2d_backward(grad, r.indices, t.shape(), MemoryFormat::channels_last);
    CHECK(dx.is_contiguous(MemoryFormat::channels_last));
    return std::vector<Tensor>{r.values, r.indices, dx};
  }, {nhwc}, 0);
  // NaN wins its window; a window of -inf points at its first element.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor special = testing::f32s({1, nan, 3, 2, -inf, -inf, -inf, -inf, 5, 0, nan, 7}, {1, 1, 3, 4});
  check_same("nan and -inf", [](auto& in) {
    const MaxPool2dResult r = max_pool2d_with_indices(in[0], {2, 2}, {1, 2});
    return std::vector<Tensor>{r.values, r.indices};
  }, {special}, 0);
}

TEST_CASE("avg_pool2d and adaptive_avg_pool2d on the GPU equal the CPU", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    const double tol = tolerance(dt);
    const Tensor x = values_in({2, 3, 9, 8}, -1, 1, dt, 13);
    for (bool include_pad : {true, false}) {
      for (std::optional<int64_t> divisor : {std::optional<int64_t>{}, std::optional<int64_t>{5}}) {
        check_same(fmt::format("avg 3x3 s2 p1 include_pad={} divisor={} {}", include_pad, divisor.value_or(0), dt),
                   [&](auto& in) {
                     const Tensor y = avg_pool2d(in[0], {3}, {2}, {1}, false, include_pad, divisor);
                     const Tensor g = ones(y.shape(), {.dtype = y.dtype(), .device = y.device()}) * 0.5;
                     return std::vector<Tensor>{y, avg_pool2d_backward(g, in[0].shape(), {3}, {2}, {1}, false,
                                                                       include_pad, divisor)};
                   }, {x}, tol);
      }
    }
    check_same(fmt::format("avg 2x3 3-d {}", dt), [](auto& in) { return std::vector<Tensor>{avg_pool2d(in[0][0], {2, 3})}; }, {x}, tol);
    for (const std::vector<int64_t>& size : {std::vector<int64_t>{1}, std::vector<int64_t>{3, 4}, std::vector<int64_t>{9, 2}}) {
      check_same(fmt::format("adaptive {}x{} {}", size[0], size.back(), dt), [&](auto& in) {
        const Tensor y = adaptive_avg_pool2d(in[0], size);
        const Tensor g = values_in(y.shape(), -1, 1, y.dtype(), 14).to(y.device());
        return std::vector<Tensor>{y, adaptive_avg_pool2d_backward(g, in[0].shape())};
      }, {x}, tol);
    }
  }
  const Tensor x = gpu(values_in({1, 2, 7, 7}, -1, 1, DType::f32));
  CHECK_THROWS_WITH(avg_pool2d(x, {2}, {2}, {0}, true), Catch::Contains("ceil_mode"));
  CHECK_THROWS_WITH(adaptive_avg_pool2d(x, {3}), Catch::Contains("not supported"));
}

TEST_CASE("a ConvNet trains the same on the GPU as on the CPU", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  manual_seed(7);
  models::ConvNet cpu_net({.in_channels = 3, .num_classes = 5, .widths = {8, 16}});
  models::ConvNet gpu_net({.in_channels = 3, .num_classes = 5, .widths = {8, 16}});
  gpu_net.load_state_dict(cpu_net.state_dict());
  gpu_net.to(Device::cuda());
  const Tensor x = values_in({4, 3, 8, 8}, -1, 1, DType::f32, 15);
  const Tensor r = values_in({4, 5}, -1, 1, DType::f32, 16);
  const Tensor cpu_loss = sum(cpu_net(x) * r);
  const Tensor gpu_loss = sum(gpu_net(gpu(x)) * gpu(r));
  cpu_loss.backward();
  gpu_loss.backward();
  KILN_CHECK_CLOSE(host(gpu_loss), cpu_loss, 1e-3, 1e-3);
  const auto gpu_params = gpu_net.named_parameters();
  const auto cpu_params = cpu_net.named_parameters();
  REQUIRE(gpu_params.size() == cpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    INFO(cpu_params[i].first);
    REQUIRE(gpu_params[i].second.grad().defined());
    KILN_CHECK_CLOSE(host(gpu_params[i].second.grad()), cpu_params[i].second.grad(), 1e-3, 1e-3);
  }
  // The running statistics moved the same way.
  const auto gpu_buffers = gpu_net.named_buffers(), cpu_buffers = cpu_net.named_buffers();
  for (size_t i = 0; i < cpu_buffers.size(); ++i) {
    INFO(cpu_buffers[i].first);
    KILN_CHECK_CLOSE(host(gpu_buffers[i].second), cpu_buffers[i].second, 1e-3, 1e-3);
  }
}

namespace {

// Benchmark mode for one scope: on, then back to the default (off) even when a check fails.
struct BenchmarkMode {
  BenchmarkMode() { cuda::set_cudnn_benchmark(true); }
  ~BenchmarkMode() { cuda::set_cudnn_benchmark(false); }
  BenchmarkMode(const BenchmarkMode&) = delete;
  BenchmarkMode& operator=(const BenchmarkMode&) = delete;
};

#ifdef KILN_HAVE_CUDNN
int64_t searches() { return cuda::dnn::cudnn_algorithm_searches(); }
#else
int64_t searches() { return 0; }
#endif

// Convolutions of ResNet-18 and ResNet-50's stages (small batch and images: the CPU side
// stays fast), none of them used by the other tests.
const std::vector<ConvCase> kResNetCases = {
    {"resnet stem", {2, 3, 32, 32}, {64, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
    {"resnet 3x3 64", {2, 64, 14, 14}, {64, 64, 3, 3}, {.padding = {1, 1}}},
    {"resnet 3x3 stride 2 128", {2, 64, 14, 14}, {128, 64, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
    {"resnet 1x1 bottleneck", {2, 256, 7, 7}, {64, 256, 1, 1}, {}},
    {"resnet 1x1 stride 2 downsample", {2, 128, 8, 8}, {256, 128, 1, 1}, {.stride = {2, 2}}},
};

}  // namespace

TEST_CASE("cudnn benchmark mode is a switch that needs no GPU", "[cuda][cudnn]") {
#ifdef KILN_HAVE_CUDNN
  CHECK_FALSE(cuda::cudnn_benchmark());
  {
    BenchmarkMode on;
    CHECK(cuda::cudnn_benchmark());
  }
  CHECK_FALSE(cuda::cudnn_benchmark());
#else
  WARN("this build has no cuDNN: there is nothing to benchmark");
#endif
}

TEST_CASE("conv2d and its gradients with cudnn benchmark on equal the CPU", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
  REQUIRE_FALSE(cuda::allow_tf32());
  BenchmarkMode on;
  for (const ConvCase& c : kResNetCases) {
    const Tensor x = values_in(c.input, -1, 1, DType::f32, 21), w = values_in(c.weight, -1, 1, DType::f32, 22);
    const Tensor b = values_in({c.weight[0]}, -1, 1, DType::f32, 23);
    const Tensor gy = values_in(conv2d(x, w, b, c.options).shape(), -1, 1, DType::f32, 24);
    check_same(fmt::format("{} benchmark", c.name), [&](auto& in) { return conv_all(in, c); }, {x, w, b, gy},
               tolerance(DType::f32));
    check_same(fmt::format("{} benchmark channels-last", c.name), [&](auto& in) { return conv_all(in, c); },
               {x, w, b, gy}, tolerance(DType::f32), channels_last);
  }
  // The small cases in every dtype: f16 and f64 time their own algorithms.
  for (DType dt : {DType::f32, DType::f64, DType::f16}) check_conv_cases(dt, "benchmark", {});
}

TEST_CASE("cudnn benchmark searches a shape once and off restores the heuristics", "[cuda][cudnn]") {
  KILN_NEEDS_GPU();
#ifndef KILN_HAVE_CUDNN
  WARN("this build has no cuDNN: nothing is searched");
  return;
#endif
  const ConvCase c{"3x3 searched once", {3, 24, 10, 10}, {40, 24, 3, 3}, {.padding = {1, 1}}};
  const Tensor x = values_in(c.input, -1, 1, DType::f32, 31), w = values_in(c.weight, -1, 1, DType::f32, 32);
  const Tensor b = values_in({40}, -1, 1, DType::f32, 33);
  const Tensor gy = values_in({3, 40, 10, 10}, -1, 1, DType::f32, 34);
  auto check_conv = [&](const std::string& what) {
    check_same(what, [&](auto& in) { return conv_all(in, c); }, {x, w, b, gy}, tolerance(DType::f32));
  };
  {
    BenchmarkMode on;
    const int64_t before = searches();
    check_conv("first call");  // forward (with and without bias: one shape), backward input, backward weight
    CHECK(searches() - before == 3);
    check_conv("second call");
    CHECK(searches() - before == 3);
  }
  // Off: the heuristics choose again (the same shape and a new one), and nothing is timed.
  const int64_t before = searches();
  check_conv("benchmark off");
  const ConvCase other{"3x3 heuristics", {3, 24, 10, 10}, {16, 24, 3, 3}, {.padding = {1, 1}}};
  check_same("benchmark off new shape", [&](auto& in) { return conv_all(in, other); },
             {x, values_in(other.weight, -1, 1, DType::f32, 35), values_in({16}, -1, 1, DType::f32, 36),
              values_in({3, 16, 10, 10}, -1, 1, DType::f32, 37)},
             tolerance(DType::f32));
  CHECK(searches() == before);
}
