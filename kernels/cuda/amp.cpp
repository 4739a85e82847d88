// CUDA kernels of the loss scaler's ops (core/ops/amp_ops.h), in kernels/scalar.h's
// arithmetic as the CPU kernels: nothing is read back on the host.
// - amp_unscale: the gradients of a call in launches of up to kGroup tensors each (a table
//   of pointers, as the optimizers' multi-tensor kernels); a thread that meets an infinity or
//   a NaN writes 1 into found_inf (every writer writes the same value, so no atomics).
// - amp_update_scale: one thread.
#include <algorithm>
#include <string>

#include "core/ops/amp_ops.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr int kGroup = 32;

// The host struct has the device struct's layout.
struct UnscaleTensor {
  const void* in;
  void* out;
  long long n, start;
};
struct UnscaleGroup {
  UnscaleTensor t[kGroup];
};
static_assert(sizeof(UnscaleTensor) == 32 && sizeof(UnscaleGroup) + 64 <= 4096);

const KernelFamily kUnscale("amp_unscale", R"(
#include "kernels/scalar.h"
typedef SCALAR T;
typedef COMPUTE C;
struct UnscaleTensor {
  const T* in;
  T* out;
  long long n, start;
};
struct UnscaleGroup {
  UnscaleTensor t[)" + std::to_string(kGroup) + R"(];
};
extern "C" __global__ void NAME(const UnscaleGroup group, long long total, const float* inv_scale, float* found_inf) {
  const float inv = *inv_scale;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool bad = false;
  int k = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= group.t[k].start + group.t[k].n) ++k;
    const UnscaleTensor& q = group.t[k];
    const long long j = i - q.start;
    q.out[j] = T(kiln::scalar::amp_unscale((C)q.in[j], inv, bad));
  }
  if (bad) *found_inf = 1.0f;
}
)",
                            {DType::f32, DType::f64, DType::f16, DType::bf16});

const KernelFamily kUpdateScale("amp_update_scale", R"(
#include "kernels/scalar.h"
extern "C" __global__ void NAME(float* scale_out, int* tracker_out, const float* scale, const int* tracker,
                                const float* found_inf, double growth_factor, double backoff_factor,
                                long long growth_interval) {
  if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
  int t = *tracker;
  const float s = kiln::scalar::amp_update_scale(*scale, t, *found_inf != 0.0f, growth_factor, backoff_factor,
                                                 growth_interval);
  *scale_out = s;
  *tracker_out = t;
}
)",
                                {DType::f32});

// in: (grad x N, found_inf, inv_scale); outs[k]: where gradient k's new values go;
// found_out: the flag the kernels set (found_inf itself for the in-place form).
void run_unscale(Span in, Span outs, const Tensor& found_out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const Tensor& inv_scale = in[static_cast<size_t>(n + 1)];
  const int device = in[0].device().index;
  // Dense copies where a gradient or its output is not contiguous; copied back after.
  std::vector<Tensor> src, dst;
  for (int64_t k = 0; k < n; ++k) {
    const Tensor& g = in[static_cast<size_t>(k)];
    const Tensor& o = outs[static_cast<size_t>(k)];
    src.push_back(g.contiguous());
    dst.push_back(o.is_contiguous() ? o : empty(o.shape(), {.dtype = o.dtype(), .device = o.device()}));
  }
  // Gradients of one dtype per launch.
  std::vector<DType> dtypes;
  for (const Tensor& g : src)
    if (std::find(dtypes.begin(), dtypes.end(), g.dtype()) == dtypes.end()) dtypes.push_back(g.dtype());
  for (DType dtype : dtypes) {
    std::vector<size_t> members;
    for (size_t k = 0; k < src.size(); ++k)
      if (src[k].dtype() == dtype && src[k].numel() > 0) members.push_back(k);
    for (size_t begin = 0; begin < members.size(); begin += kGroup) {
      UnscaleGroup group{};
      long long total = 0;
      for (size_t e = begin; e < std::min(members.size(), begin + kGroup); ++e) {
        UnscaleTensor& t = group.t[e - begin];
        t.in = src[members[e]].data_ptr();
        t.out = dst[members[e]].data_ptr();
        t.n = src[members[e]].numel();
        t.start = total;
        total += t.n;
      }
      kUnscale.launch(dtype, device, std::min<long long>(total, 65536LL * KernelFamily::kBlock), group, total,
                      inv_scale.data_ptr(), found_out.data_ptr());
    }
  }
  for (size_t k = 0; k < dst.size(); ++k)
    if (!dst[k].same(outs[k])) Tensor(outs[k]).copy_(dst[k]);
}

void unscale_inplace(Span in, Span, const Attrs& attrs) {
  const auto n = static_cast<size_t>(attrs.i("count"));
  run_unscale(in, in.subspan(0, n), in[n], attrs);
}
// out: (new grad x N, new found_inf): the flag starts as the input's (a device copy).
void unscale(Span in, Span out, const Attrs& attrs) {
  const auto n = static_cast<size_t>(attrs.i("count"));
  Tensor(out[n]).copy_(in[n]);
  run_unscale(in, out.subspan(0, n), out[n], attrs);
}

void run_update(Span in, const Tensor& scale_out, const Tensor& tracker_out, const Attrs& attrs) {
  kUpdateScale.launch(DType::f32, in[0].device().index, 1, scale_out.data_ptr(), tracker_out.data_ptr(),
                      in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(), attrs.f("growth_factor"),
                      attrs.f("backoff_factor"), static_cast<long long>(attrs.i("growth_interval")));
}
void update_inplace(Span in, Span, const Attrs& attrs) { run_update(in, in[0], in[1], attrs); }
void update(Span in, Span out, const Attrs& attrs) { run_update(in, out[0], out[1], attrs); }

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("amp_unscale_", cuda, unscale_inplace);
    register_kernel("amp_unscale", cuda, unscale);
    register_kernel("amp_update_scale_", cuda, update_inplace);
    register_kernel("amp_update_scale", cuda, update);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
