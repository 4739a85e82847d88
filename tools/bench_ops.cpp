// kiln-bench ops: single ops timed, one JSON line each (CPU, or CUDA with --device cuda).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "kernels/cpu/gemm.h"
#include "tools/bench_common.h"

namespace kiln::bench {
namespace {

// The best of `reps` timed runs after one warm-up, in milliseconds.
double time_ms(const std::function<void()>& f, int reps) {
  f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

// The median of `reps` runs of f on the GPU after two warm-ups, timed with CUDA events.
double gpu_time_ms(const std::function<void()>& f, int reps) {
  f();
  f();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cuda::Event start, stop;
    start.record();
    f();
    stop.record();
    stop.synchronize();
    times.push_back(stop.elapsed_ms(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int bench_ops() {
  manual_seed(0);
  {  // 16-bit elementwise ops against f32 on a ResNet-50 activation: half the bytes, so at
     // most f32's time is the goal (the 16-bit <-> f32 conversions must vectorize)
    const std::vector<int64_t> shape{8, 64, 56, 56};
    const Tensor x32 = randn(shape), y32 = randn(shape);
    const Tensor w = rand({64}), b = randn({64}), mean = zeros({64}), var = ones({64});
    const std::vector<std::pair<std::string, std::function<void(const Tensor&, const Tensor&)>>> ops{
        {"relu", [](const Tensor& x, const Tensor&) { Tensor t = relu(x); }},
        {"add", [](const Tensor& x, const Tensor& y) { Tensor t = x + y; }},
        {"relu_grad", [](const Tensor& x, const Tensor& y) { Tensor t = where(x > 0, y, 0); }},
        {"batch_norm", [&](const Tensor& x, const Tensor&) {
           Tensor t = batch_norm(x, w, b, mean.clone(), var.clone(), true);
         }},
    };
    for (const auto& [op_name, op] : ops) {
      const double f32 = time_ms([&] { op(x32, y32); }, 20);
      for (DType dtype : {DType::bf16, DType::f16}) {
        const Tensor x = x32.to(dtype), y = y32.to(dtype);
        const double ms = time_ms([&] { op(x, y); }, 20);
        fmt::print(R"({{"bench":"{}","shape":[8,64,56,56],"dtype":"{}","ms":{:.3f},"f32_ms":{:.3f},"ratio_to_f32":{:.2f}}})" "\n",
                   op_name, name(dtype), ms, f32, ms / f32);
      }
    }
    // The same relu(x + y) compiled: the generated C++ kernel converts per element too.
    auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {relu(a[0] + a[1])}; };
    CompiledFunction compiled32 = compile(fn);
    const double f32 = time_ms([&] { compiled32({x32, y32}); }, 20);
    for (DType dtype : {DType::bf16, DType::f16}) {
      const Tensor x = x32.to(dtype), y = y32.to(dtype);
      CompiledFunction compiled = compile(fn);
      const double ms = time_ms([&] { compiled({x, y}); }, 20);
      fmt::print(R"({{"bench":"compiled_relu_add","shape":[8,64,56,56],"dtype":"{}","ms":{:.3f},"f32_ms":{:.3f},"ratio_to_f32":{:.2f}}})" "\n",
                 name(dtype), ms, f32, ms / f32);
    }
  }
  {  // elementwise add against memcpy of the same bytes
    const int64_t n = 64ll << 20;
    Tensor a = rand({n}), b = rand({n}), out = empty({n});
    const double bytes = 3.0 * static_cast<double>(n) * 4;  // read a and b, write out
    out.copy_(a);
    const double ms_add = time_ms([&] { out.add_(b); }, 5);  // reads out and b, writes out
    const double ms_fresh = time_ms([&] { Tensor c = a + b; }, 5);
    Tensor dst = empty({n});
    const double ms_copy = time_ms(
        [&] { std::memcpy(dst.data_ptr(), a.data_ptr(), static_cast<size_t>(n) * 4); }, 5);
    const double copy_gbps = 2.0 * static_cast<double>(n) * 4 / ms_copy / 1e6;
    const double add_gbps = bytes / ms_add / 1e6;
    fmt::print(R"({{"bench":"memcpy","bytes":{},"ms":{:.3f},"gb_per_s":{:.2f}}})" "\n", n * 4, ms_copy, copy_gbps);
    fmt::print(R"({{"bench":"add_","numel":{},"dtype":"f32","ms":{:.3f},"gb_per_s":{:.2f},"ratio_to_memcpy":{:.2f}}})" "\n",
               n, ms_add, add_gbps, add_gbps / copy_gbps);
    fmt::print(R"({{"bench":"add","numel":{},"dtype":"f32","ms":{:.3f},"gb_per_s":{:.2f},"ratio_to_memcpy":{:.2f},"note":"out of place: the output comes from the allocator"}})" "\n",
               n, ms_fresh, bytes / ms_fresh / 1e6, bytes / ms_fresh / 1e6 / copy_gbps);
  }
  {  // f32 products through each GEMM backend this build has: 1024^3, and the im2col
     // product of a 3x3 convolution over 64 channels on 64x64 planes
    const std::vector<std::array<int64_t, 3>> sizes = {{1024, 1024, 1024}, {4096, 64, 576}};
    const cpu::GemmBackend original = cpu::gemm_backend();
    for (const auto& [m, n, k] : sizes) {
      Tensor a = randn({m, k}), b = randn({k, n});
      const double flop = 2.0 * m * n * k;
      for (cpu::GemmBackend backend : cpu::gemm_backends()) {
        cpu::set_gemm_backend(backend);
        const double ms = time_ms([&] { Tensor c = matmul(a, b); }, 5);
        fmt::print(R"({{"bench":"matmul","m":{},"n":{},"k":{},"dtype":"f32","backend":"{}","ms":{:.3f},"gflop_per_s":{:.1f}}})" "\n",
                   m, n, k, cpu::gemm_backend_name(backend), ms, flop / ms / 1e6);
      }
    }
    cpu::set_gemm_backend(original);
  }
  {  // bf16 against f32 in the same run: 1024^3 and a ResNet-50 fc-sized product
    const std::vector<std::array<int64_t, 3>> sizes = {{1024, 1024, 1024}, {256, 1000, 2048}};
    for (const auto& [m, n, k] : sizes) {
      Tensor a = randn({m, k}), b = randn({k, n});
      Tensor a16 = a.to(DType::bf16), b16 = b.to(DType::bf16);
      const double flop = 2.0 * m * n * k;
      const double f32 = time_ms([&] { Tensor c = matmul(a, b); }, 5);
      const double bf16 = time_ms([&] { Tensor c = matmul(a16, b16); }, 5);
      fmt::print(R"({{"bench":"matmul","m":{},"n":{},"k":{},"dtype":"bf16","bf16_gemm":"{}","ms":{:.3f},"gflop_per_s":{:.1f},"f32_ms":{:.3f},"speedup_vs_f32":{:.2f}}})" "\n",
                 m, n, k, bf16_gemm_name(), bf16, flop / bf16 / 1e6, f32, f32 / bf16);
    }
  }
  // ResNet-50-sized 3x3 convolutions (layer1 and layer3), forward and both backward ops,
  // in f32 and then in bf16 against it, NCHW and channels_last.
  struct ConvBench {
    Shape input, weight;
  };
  const std::vector<ConvBench> convs = {{{8, 64, 56, 56}, {64, 64, 3, 3}},
                                        {{8, 256, 14, 14}, {256, 256, 3, 3}}};
  for (const ConvBench& cb : convs)
    for (const MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      const Conv2dOptions opts{.padding = {1, 1}};
      const Tensor x32 = randn(cb.input).contiguous(format), w32 = randn(cb.weight);
      const double flop = 2.0 * numel_of(cb.input) * cb.weight[0] * cb.weight[2] * cb.weight[3];
      struct Times {
        double fwd, bwd_in, bwd_w;
      };
      auto measure = [&](DType dtype) {
        const Tensor x = x32.to(dtype), w = w32.to(dtype);
        const Tensor y = conv2d(x, w, {}, opts);
        return Times{time_ms([&] { Tensor t = conv2d(x, w, {}, opts); }, 5),
                     time_ms([&] { Tensor t = conv2d_backward_input(y, w, x.shape(), opts); }, 3),
                     time_ms([&] { Tensor t = conv2d_backward_weight(y, x, w.shape(), opts); }, 3)};
      };
      const Times f32 = measure(DType::f32);
      const std::string layout = format == MemoryFormat::channels_last ? "channels_last" : "contiguous";
      const std::string shapes = fmt::format(R"("input":[{}],"weight":[{}],"padding":1,"layout":"{}")",
                                             fmt::join(cb.input, ","), fmt::join(cb.weight, ","), layout);
      fmt::print(R"({{"bench":"conv2d",{},"dtype":"f32","ms":{:.3f},"gflop_per_s":{:.1f},"backward_input_ms":{:.3f},"backward_weight_ms":{:.3f}}})" "\n",
                 shapes, f32.fwd, flop / f32.fwd / 1e6, f32.bwd_in, f32.bwd_w);
      const Times bf16 = measure(DType::bf16);
      fmt::print(R"({{"bench":"conv2d",{},"dtype":"bf16","bf16_gemm":"{}","ms":{:.3f},"gflop_per_s":{:.1f},"backward_input_ms":{:.3f},"backward_weight_ms":{:.3f},)"
                 R"("speedup_vs_f32":{:.2f},"backward_input_speedup_vs_f32":{:.2f},"backward_weight_speedup_vs_f32":{:.2f}}})" "\n",
                 shapes, bf16_gemm_name(), bf16.fwd, flop / bf16.fwd / 1e6, bf16.bwd_in, bf16.bwd_w,
                 f32.fwd / bf16.fwd, f32.bwd_in / bf16.bwd_in, f32.bwd_w / bf16.bwd_w);
    }
  return 0;
}

// `kiln-bench ops --device cuda`: the generated elementwise kernels against a device copy,
// and cuBLAS products in f32 (with and without TF32) and bf16.
int bench_ops_cuda() {
  KILN_CHECK(cuda::is_available(), "kiln-bench ops --device cuda: CUDA is not available: {}",
             cuda::unavailable_reason());
  manual_seed(0);
  const Device gpu = Device::cuda();
  const cuda::DeviceProperties props = cuda::device_properties(0);
  fmt::print(R"({{"bench":"device","name":"{}","arch":"{}","multiprocessors":{},"memory_gib":{:.1f}}})" "\n",
             props.name, props.arch(), props.multiprocessors, static_cast<double>(props.total_memory) / (1 << 30));
  {
    const int64_t n = 256ll << 20;
    Tensor a = rand({n}).to(gpu), b = rand({n}).to(gpu), out = empty({n}, {.device = gpu});
    const double copy_ms = gpu_time_ms([&] { out.copy_(a); }, 10);
    const double add_ms = gpu_time_ms([&] { out.add_(b); }, 10);
    const double fresh_ms = gpu_time_ms([&] { Tensor c = a * b + 1; }, 10);
    const double copy_gbps = 2.0 * static_cast<double>(n) * 4 / copy_ms / 1e6;
    fmt::print(R"({{"bench":"copy_","device":"cuda","numel":{},"dtype":"f32","ms":{:.3f},"gb_per_s":{:.1f}}})" "\n", n, copy_ms, copy_gbps);
    const double add_gbps = 3.0 * static_cast<double>(n) * 4 / add_ms / 1e6;
    fmt::print(R"({{"bench":"add_","device":"cuda","numel":{},"dtype":"f32","ms":{:.3f},"gb_per_s":{:.1f},"ratio_to_copy":{:.2f}}})" "\n",
               n, add_ms, add_gbps, add_gbps / copy_gbps);
    fmt::print(R"({{"bench":"mul_add","device":"cuda","numel":{},"dtype":"f32","ms":{:.3f},"note":"a * b + 1: two eager kernels"}})" "\n",
               n, fresh_ms);
    const double sum_ms = gpu_time_ms([&] { Tensor t = sum(a, {0}); }, 10);
    fmt::print(R"({{"bench":"sum","device":"cuda","numel":{},"dtype":"f32","ms":{:.3f},"gb_per_s":{:.1f}}})" "\n",
               n, sum_ms, static_cast<double>(n) * 4 / sum_ms / 1e6);
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 8192;
    Tensor a = randn({n, n}).to(dt).to(gpu), b = randn({n, n}).to(dt).to(gpu);
    const double flop = 2.0 * n * n * n;
    for (bool tf32 : {false, true}) {
      if (dt != DType::f32 && tf32) continue;
      cuda::set_allow_tf32(tf32);
      const double ms = gpu_time_ms([&] { Tensor c = mm(a, b); }, 5);
      fmt::print(R"({{"bench":"matmul","device":"cuda","m":{},"n":{},"k":{},"dtype":"{}","tf32":{},"ms":{:.3f},"tflop_per_s":{:.1f}}})" "\n",
                 n, n, n, dt, tf32, ms, flop / ms / 1e9);
    }
    cuda::set_allow_tf32(false);
  }
  std::cerr << cuda::memory_summary();
  return 0;
}

}  // namespace kiln::bench
