// CPU kernels of the loss scaler's ops (core/ops/amp_ops.h): the element arithmetic is
// kernels/scalar.h's amp_unscale and amp_update_scale, which the CUDA kernels run too.
#include <atomic>

#include "core/ops/amp_ops.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// out = g * inv_scale, element by element (out may be g); returns whether g held an
// infinity or a NaN.
bool unscale_into(const Tensor& g, const Tensor& out, float inv_scale) {
  const Tensor src = g.contiguous();
  const Tensor dst = out.is_contiguous() ? out : empty(out.shape(), {.dtype = out.dtype()});
  std::atomic<bool> nonfinite{false};
  visit_floating(g.dtype(), "amp_unscale", [&]<class T>() {
    using C = compute_t<T>;
    const T* in = src.data_ptr<T>();
    T* o = dst.data_ptr<T>();
    parallel_for(g.numel(), kGrain, [&](int64_t begin, int64_t end) {
      bool bad = false;
      for (int64_t i = begin; i < end; ++i)
        o[i] = static_cast<T>(scalar::amp_unscale(static_cast<C>(in[i]), inv_scale, bad));
      if (bad) nonfinite.store(true, std::memory_order_relaxed);
    });
  });
  if (!dst.same(out)) Tensor(out).copy_(dst);
  return nonfinite.load();
}

// in: (grad x N, found_inf, inv_scale); outs(k): where gradient k's new values go.
template <class Outs>
void run_unscale(Span in, const Attrs& attrs, const Tensor& found_out, Outs outs) {
  const int64_t n = attrs.i("count");
  const Tensor& found_inf = in[static_cast<size_t>(n)];
  const float inv_scale = in[static_cast<size_t>(n + 1)].item<float>();
  bool nonfinite = found_inf.item<float>() != 0.0f;
  for (int64_t k = 0; k < n; ++k)
    if (unscale_into(in[static_cast<size_t>(k)], outs(k), inv_scale)) nonfinite = true;
  Tensor(found_out).fill_(nonfinite ? 1.0 : found_inf.item<double>());
}

void unscale_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  run_unscale(in, attrs, in[static_cast<size_t>(n)], [&](int64_t k) { return in[static_cast<size_t>(k)]; });
}
// out: (new grad x N, new found_inf).
void unscale(Span in, Span out, const Attrs& attrs) {
  run_unscale(in, attrs, out.back(), [&](int64_t k) { return out[static_cast<size_t>(k)]; });
}

// in: (scale, growth_tracker, found_inf); writes the new scale and tracker into the outputs
// (the inputs themselves for the in-place form).
void run_update(Span in, const Tensor& scale_out, const Tensor& tracker_out, const Attrs& attrs) {
  int tracker = in[1].item<int32_t>();
  const float scale =
      scalar::amp_update_scale(in[0].item<float>(), tracker, in[2].item<float>() != 0.0f, attrs.f("growth_factor"),
                               attrs.f("backoff_factor"), attrs.i("growth_interval"));
  *Tensor(scale_out).data_ptr<float>() = scale;
  *Tensor(tracker_out).data_ptr<int32_t>() = tracker;
}
void update_inplace(Span in, Span, const Attrs& attrs) { run_update(in, in[0], in[1], attrs); }
void update(Span in, Span out, const Attrs& attrs) { run_update(in, out[0], out[1], attrs); }

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("amp_unscale_", cpu, unscale_inplace);
    register_kernel("amp_unscale", cpu, unscale);
    register_kernel("amp_update_scale_", cpu, update_inplace);
    register_kernel("amp_update_scale", cpu, update);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
