#include "kernels/cuda/optim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

// A parameter's pointers and where its elements start in the group's index space. The
// host struct below has the device struct's layout.
struct SgdParam {
  void* p_out;
  void* buf_out;  // null without momentum buffers
  const void* p;
  const void* g;
  const void* buf;
  long long n, start;
};
struct SgdParams {
  SgdParam param[kSgdGroup];
};
// The device structs below declare the same fields; a launch's arguments stay under 4 KB.
static_assert(sizeof(SgdParam) == 56 && sizeof(SgdParams) + 64 <= 4096);

// The hyperparameters come as f64 arguments (the op's hyperparameters are host tensors).
// The order of the operations and the casts of the hyperparameters are the CPU kernel's
// (sgd_constants, sgd_range), so each element's result is its result bit for bit (NVRTC
// compiles without FMA contraction).
const KernelFamily kSgdMulti("sgd_multi", R"(
typedef SCALAR T;
struct SgdParam {
  T* p_out;
  T* buf_out;
  const T* p;
  const T* g;
  const T* buf;
  long long n, start;
};
struct SgdParams {
  SgdParam param[)" + std::to_string(kSgdGroup) + R"(];
};
extern "C" __global__ void NAME(const SgdParams group, double lr_, double momentum_, double dampening_,
                                double weight_decay_, long long total, int maximize, int nesterov, int first) {
  const T lr = (T)lr_, momentum = (T)momentum_, one_minus_dampening = (T)(1.0 - dampening_), weight_decay = (T)weight_decay_;
  const bool decay = weight_decay_ != 0.0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  int k = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= group.param[k].start + group.param[k].n) ++k;
    const SgdParam& q = group.param[k];
    const long long j = i - q.start;
    T d = maximize ? -q.g[j] : q.g[j];
    if (decay) d = d + weight_decay * q.p[j];
    if (q.buf_out && momentum == T(0)) {
      q.buf_out[j] = q.buf[j];
    } else if (q.buf_out) {
      const T b = first ? d : momentum * q.buf[j] + one_minus_dampening * d;
      q.buf_out[j] = b;
      d = nesterov ? d + momentum * b : b;
    }
    q.p_out[j] = q.p[j] - lr * d;
  }
}
)",
                                {DType::f32, DType::f64});

// AdamW: parameter k's factors come from its own step count, in f64 on the host as the CPU
// kernel computes them (adamw_factors), and are cast to T in the kernel as there; the
// elementwise work is adamw_range's, operation for operation (std::max(a, b) is
// a < b ? b : a).
struct AdamParam {
  void *p_out, *m_out, *v_out, *vmax_out;  // vmax_out null without amsgrad
  const void *p, *g, *m, *v, *vmax;
  long long n, start;
  double decay, one_minus_b1, b2, one_minus_b2, step_size, correction2_sqrt, eps;
};
struct AdamParams {
  AdamParam param[kAdamGroup];
};
static_assert(sizeof(AdamParam) == 144 && sizeof(AdamParams) + 64 <= 4096);

const KernelFamily kAdamMulti("adamw_multi", R"(
typedef SCALAR T;
struct AdamParam {
  T *p_out, *m_out, *v_out, *vmax_out;
  const T *p, *g, *m, *v, *vmax;
  long long n, start;
  double decay, one_minus_b1, b2, one_minus_b2, step_size, correction2_sqrt, eps;
};
struct AdamParams {
  AdamParam param[)" + std::to_string(kAdamGroup) + R"(];
};
extern "C" __global__ void NAME(const AdamParams group, long long total, int maximize) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  int k = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= group.param[k].start + group.param[k].n) ++k;
    const AdamParam& q = group.param[k];
    const long long j = i - q.start;
    const T grad = maximize ? -q.g[j] : q.g[j];
    const T param = q.p[j] * (T)q.decay;
    const T m = q.m[j] + (T)q.one_minus_b1 * (grad - q.m[j]);
    const T v = q.v[j] * (T)q.b2 + (T)q.one_minus_b2 * grad * grad;
    q.m_out[j] = m;
    q.v_out[j] = v;
    T second = v;
    if (q.vmax_out) {
      second = q.vmax[j] < v ? v : q.vmax[j];
      q.vmax_out[j] = second;
    }
    const T denom = sqrt(second) / (T)q.correction2_sqrt + (T)q.eps;
    q.p_out[j] = param - (T)q.step_size * (m / denom);
  }
}
)",
                                 {DType::f32, DType::f64});

// Whether t's elements lie in `like`'s memory order: the same dtype, device and shape, the
// same strides on every dim of size above 1, and `like` dense (contiguous or
// channels_last), so that one flat index walks both alike.
bool dense_like(const Tensor& t, const Tensor& like) {
  if (!t.defined() || t.dtype() != like.dtype() || t.device() != like.device() || t.shape() != like.shape()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != like.stride(d)) return false;
  return like.is_contiguous() || like.is_contiguous(MemoryFormat::channels_last);
}

// Splits parameters 0..n-1 into those the kernels take and the rest: f32 or f64 of
// `first`'s dtype and device, with every tensor `tensors(k)` gives (the parameter first)
// in the parameter's dense memory order.
template <class Tensors>
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_params(int64_t n, const Tensor& first, Tensors tensors) {
  const DType dt = first.dtype();
  std::vector<int64_t> fast, rest;
  for (int64_t k = 0; k < n; ++k) {
    const std::vector<Tensor> t = tensors(k);
    const Tensor& p = t[0];
    bool ok = (dt == DType::f32 || dt == DType::f64) && p.dtype() == dt && p.device() == first.device();
    for (const Tensor& x : t) ok = ok && dense_like(x, p);
    (ok ? fast : rest).push_back(k);
  }
  return {fast, rest};
}

// Runs `params` in launches of as many as a Group's table holds: fill(entry, k) sets
// parameter k's pointers (and whatever else it carries) and returns its element count;
// launch(group, total, threads) queues the kernel over the group's `total` elements.
template <class Group, class Fill, class Launch>
void for_each_group(const std::vector<int64_t>& params, Fill fill, Launch launch) {
  constexpr size_t size = std::extent_v<decltype(Group::param)>;
  for (size_t begin = 0; begin < params.size(); begin += size) {
    Group group{};
    long long total = 0;
    for (size_t e = begin; e < std::min(params.size(), begin + size); ++e) {
      auto& q = group.param[e - begin];
      q.n = fill(q, params[e]);
      q.start = total;
      total += q.n;
    }
    if (total > 0) launch(group, total, std::min<long long>(total, 65536LL * KernelFamily::kBlock));
  }
}

}  // namespace

std::vector<int64_t> sgd_update_multi_tensor(std::span<const Tensor> in, std::span<const Tensor> p_out,
                                             std::span<const Tensor> buf_out, const Attrs& attrs) {
  const auto n = static_cast<int64_t>(p_out.size());
  const auto at = [&](int64_t role, int64_t k) -> const Tensor& { return in[static_cast<size_t>(role * n + k)]; };
  const bool has_buf = at(2, 0).defined();
  const auto [fast, rest] = split_params(n, in[0], [&](int64_t k) {
    std::vector<Tensor> t = {at(0, k), at(1, k), p_out[static_cast<size_t>(k)]};
    if (has_buf) t.insert(t.end(), {at(2, k), buf_out[static_cast<size_t>(k)]});
    return t;
  });
  const size_t h = static_cast<size_t>(3 * n);
  const double lr = in[h].item<double>(), momentum = in[h + 1].item<double>(), dampening = in[h + 2].item<double>(),
               weight_decay = in[h + 3].item<double>();
  const int maximize = attrs.b("maximize"), nesterov = attrs.b("nesterov"), first = attrs.b("first");
  for_each_group<SgdParams>(
      fast,
      [&](SgdParam& q, int64_t k) {
        const auto s = static_cast<size_t>(k);
        q.p_out = p_out[s].data_ptr();
        q.buf_out = has_buf ? buf_out[s].data_ptr() : nullptr;
        q.p = at(0, k).data_ptr();
        q.g = at(1, k).data_ptr();
        q.buf = has_buf ? at(2, k).data_ptr() : nullptr;
        return at(0, k).numel();
      },
      [&](const SgdParams& group, long long total, long long threads) {
        kSgdMulti.launch(in[0].dtype(), in[0].device().index, threads, group, lr, momentum, dampening, weight_decay,
                         total, maximize, nesterov, first);
      });
  return rest;
}

std::vector<int64_t> adamw_update_multi_tensor(std::span<const Tensor> in, const std::array<std::span<const Tensor>, 4>& out,
                                               const Attrs& attrs) {
  const auto n = static_cast<int64_t>(out[0].size());
  const auto at = [&](int64_t role, int64_t k) -> const Tensor& { return in[static_cast<size_t>(role * n + k)]; };
  const bool amsgrad = at(4, 0).defined();
  const auto [fast, rest] = split_params(n, in[0], [&](int64_t k) {
    const auto s = static_cast<size_t>(k);
    std::vector<Tensor> t = {at(0, k), at(1, k), at(2, k), at(3, k), out[0][s], out[1][s], out[2][s]};
    if (amsgrad) t.insert(t.end(), {at(4, k), out[3][s]});
    return t;
  });
  const size_t h = static_cast<size_t>(6 * n);
  const double lr = in[h].item<double>(), beta1 = in[h + 1].item<double>(), beta2 = in[h + 2].item<double>(),
               eps = in[h + 3].item<double>(), weight_decay = in[h + 4].item<double>();
  const int maximize = attrs.b("maximize");
  for_each_group<AdamParams>(
      fast,
      [&](AdamParam& q, int64_t k) {
        const auto s = static_cast<size_t>(k);
        q.p_out = out[0][s].data_ptr();
        q.m_out = out[1][s].data_ptr();
        q.v_out = out[2][s].data_ptr();
        q.vmax_out = amsgrad ? out[3][s].data_ptr() : nullptr;
        q.p = at(0, k).data_ptr();
        q.g = at(1, k).data_ptr();
        q.m = at(2, k).data_ptr();
        q.v = at(3, k).data_ptr();
        q.vmax = amsgrad ? at(4, k).data_ptr() : nullptr;
        // The CPU kernel's factors (kernels/cpu/optim_ops.cpp, adamw_factors), in f64.
        const double step = at(5, k).item<double>();
        q.decay = 1.0 - lr * weight_decay;
        q.one_minus_b1 = 1.0 - beta1;
        q.b2 = beta2;
        q.one_minus_b2 = 1.0 - beta2;
        q.step_size = lr / (1.0 - std::pow(beta1, step));
        q.correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, step));
        q.eps = eps;
        return at(0, k).numel();
      },
      [&](const AdamParams& group, long long total, long long threads) {
        kAdamMulti.launch(in[0].dtype(), in[0].device().index, threads, group, total, maximize);
      });
  return rest;
}

}  // namespace kiln::cuda
