// kiln-bench: speed measured as ratios in one run. `kiln-bench ops` times single ops and
// prints one JSON line each.
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "kernels/cpu/gemm.h"

using namespace kiln;

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

int bench_ops() {
  manual_seed(0);
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
  {  // f32 matmul, 1024^3, through each GEMM backend this build has
    const int64_t n = 1024;
    Tensor a = randn({n, n}), b = randn({n, n});
    const double flop = 2.0 * n * n * n;
    std::vector<cpu::GemmBackend> backends{cpu::GemmBackend::eigen};
    if (cpu::gemm_blas_available()) backends.insert(backends.begin(), cpu::GemmBackend::blas);
    const cpu::GemmBackend original = cpu::gemm_backend();
    for (cpu::GemmBackend backend : backends) {
      cpu::set_gemm_backend(backend);
      const double ms = time_ms([&] { Tensor c = matmul(a, b); }, 5);
      fmt::print(R"({{"bench":"matmul","m":{},"n":{},"k":{},"dtype":"f32","backend":"{}","ms":{:.3f},"gflop_per_s":{:.1f}}})" "\n",
                 n, n, n, backend == cpu::GemmBackend::blas ? "openblas" : "eigen", ms, flop / ms / 1e6);
    }
    cpu::set_gemm_backend(original);
  }
  {  // a ResNet-50-sized 3x3 convolution (layer1), forward and both backward ops
    Tensor x = randn({8, 64, 56, 56}), w = randn({64, 64, 3, 3});
    const Conv2dOptions opts{.padding = {1, 1}};
    Tensor y = conv2d(x, w, {}, opts);
    const double flop = 2.0 * 8 * 64 * 56 * 56 * 64 * 9;
    const double fwd = time_ms([&] { Tensor t = conv2d(x, w, {}, opts); }, 5);
    const double bwd_in = time_ms([&] { Tensor t = conv2d_backward_input(y, w, x.shape(), opts); }, 3);
    const double bwd_w = time_ms([&] { Tensor t = conv2d_backward_weight(y, x, w.shape(), opts); }, 3);
    fmt::print(R"({{"bench":"conv2d","input":[8,64,56,56],"weight":[64,64,3,3],"padding":1,"dtype":"f32","ms":{:.3f},"gflop_per_s":{:.1f},"backward_input_ms":{:.3f},"backward_weight_ms":{:.3f}}})" "\n",
               fwd, flop / fwd / 1e6, bwd_in, bwd_w);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 2 && std::strcmp(argv[1], "ops") == 0) return bench_ops();
    std::cerr << "usage: kiln-bench ops\n"
                 "  ops   GFLOP/s of a 1024^3 f32 matmul, GB/s of a 64M-element add against\n"
                 "        memcpy, ms of a ResNet-50-sized conv2d; one JSON line each\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "kiln-bench: " << e.what() << "\n";
    return 1;
  }
}
