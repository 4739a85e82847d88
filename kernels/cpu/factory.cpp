// CPU kernels of the factory ops, random ones included. Each element is computed from its
// index alone (random ones from the Philox counter offset + index), so threads split the
// work in any way and give the same tensor.
#include "core/registry.h"
#include "kernels/cpu/parallel.h"
#include "core/philox.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// out[i] = f(i) for a contiguous output.
template <class T, class F>
void generate(const Tensor& out, F f) {
  T* p = static_cast<T*>(out.data_ptr());
  parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = static_cast<T>(f(i));
  });
}

void empty(Span, Span, const Attrs&) {}

void full(Span, Span out, const Attrs& a) {
  const Scalar v = a.scalar("value");
  visit_dtype(out[0].dtype(), [&]<class T>() {
    const T value = v.to<T>();
    generate<T>(out[0], [value](int64_t) { return value; });
  });
}

void arange(Span, Span out, const Attrs& a) {
  const Scalar start = a.scalar("start"), step = a.scalar("step");
  visit_dtype(out[0].dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("arange: dtype bool is not supported");
    } else if (is_floating(dtype_v<T>)) {
      const double s = start.to_double(), st = step.to_double();
      generate<T>(out[0], [=](int64_t i) { return static_cast<compute_t<T>>(s + st * static_cast<double>(i)); });
    } else {
      const int64_t s = start.to_int(), st = step.to_int();
      generate<T>(out[0], [=](int64_t i) { return s + st * i; });
    }
  });
}

void linspace(Span, Span out, const Attrs& a) {
  const double start = a.f("start"), end = a.f("end");
  const int64_t n = out[0].numel();
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  visit_dtype(out[0].dtype(), [&]<class T>() {
    // Like PyTorch: the second half counts back from the end, so both ends are exact; a
    // single step is `start`.
    generate<T>(out[0], [=](int64_t i) {
      const double v = i < n / 2 || n == 1 ? start + step * static_cast<double>(i)
                                 : end - step * static_cast<double>(n - 1 - i);
      // Integers through i64 (a negative value into u8 wraps, as every other conversion
      // does; straight from double it would be undefined), bool by v != 0.
      if constexpr (std::is_same_v<T, bool>) return v != 0;
      else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<int64_t>(v));
      else return static_cast<compute_t<T>>(v);
    });
  });
}

void eye(Span, Span out, const Attrs&) {
  const int64_t m = out[0].size(1);
  visit_dtype(out[0].dtype(), [&]<class T>() {
    generate<T>(out[0], [=](int64_t i) { return static_cast<compute_t<T>>(i / m == i % m ? 1 : 0); });
  });
}

void uniform(Span, Span out, const Attrs& a) {
  const auto seed = static_cast<uint64_t>(a.i("seed")), offset = static_cast<uint64_t>(a.i("offset"));
  const double low = a.f("low"), high = a.f("high");
  visit_floating(out[0].dtype(), "uniform", [&]<class T>() {
    using C = compute_t<T>;
    generate<T>(out[0], [=](int64_t i) {
      const philox::Block b = philox::random4(seed, offset + static_cast<uint64_t>(i));
      if constexpr (std::is_same_v<C, double>) {
        return low + (high - low) * philox::uniform_f64(b);
      } else {
        const int digits = std::is_same_v<T, float> ? 24 : std::is_same_v<T, Half> ? 11 : 8;
        const float u = digits == 24 ? philox::uniform_f32(b) : philox::uniform_digits(b, digits);
        return static_cast<float>(low) + static_cast<float>(high - low) * u;
      }
    });
  });
}

void normal(Span, Span out, const Attrs& a) {
  const auto seed = static_cast<uint64_t>(a.i("seed")), offset = static_cast<uint64_t>(a.i("offset"));
  const double mean = a.f("mean"), std = a.f("std");
  visit_floating(out[0].dtype(), "normal", [&]<class T>() {
    using C = compute_t<T>;
    generate<T>(out[0], [=](int64_t i) {
      const philox::Block b = philox::random4(seed, offset + static_cast<uint64_t>(i));
      if constexpr (std::is_same_v<C, double>) return mean + std * philox::normal_f64(b);
      else return static_cast<float>(mean) + static_cast<float>(std) * philox::normal_f32(b);
    });
  });
}

void randint(Span, Span out, const Attrs& a) {
  const auto seed = static_cast<uint64_t>(a.i("seed")), offset = static_cast<uint64_t>(a.i("offset"));
  const int64_t low = a.i("low");
  const auto range = static_cast<uint64_t>(a.i("high") - low);
  visit_dtype(out[0].dtype(), [&]<class T>() {
    generate<T>(out[0], [=](int64_t i) {
      const philox::Block b = philox::random4(seed, offset + static_cast<uint64_t>(i));
      const int64_t v = low + static_cast<int64_t>(philox::bits64(b) % range);
      // Integers through i64 (a negative value into u8 wraps, as every other conversion
      // does; straight from double it would be undefined), bool by v != 0.
      if constexpr (std::is_same_v<T, bool>) return v != 0;
      else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<int64_t>(v));
      else return static_cast<compute_t<T>>(v);
    });
  });
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("empty", cpu, empty);
    register_kernel("full", cpu, full);
    register_kernel("arange", cpu, arange);
    register_kernel("linspace", cpu, linspace);
    register_kernel("eye", cpu, eye);
    register_kernel("uniform", cpu, uniform);
    register_kernel("normal", cpu, normal);
    register_kernel("randint", cpu, randint);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
