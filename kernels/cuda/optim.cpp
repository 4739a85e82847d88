#include "kernels/cuda/optim.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
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

// hyper: lr, momentum, dampening, weight_decay as f64. The order of the operations and the
// casts of the hyperparameters are the CPU kernel's (sgd_constants, sgd_range), so each
// element's result is its result bit for bit (NVRTC compiles without FMA contraction).
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
extern "C" __global__ void NAME(const SgdParams group, const double* hyper, long long total, int maximize,
                                int nesterov, int first) {
  const T lr = (T)hyper[0], momentum = (T)hyper[1], one_minus_dampening = (T)(1.0 - hyper[2]), weight_decay = (T)hyper[3];
  const bool decay = hyper[3] != 0.0;
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

// Whether t is dense in `like`'s layout: its strides, and `like` contiguous or
// channels_last (so elements are walked in memory order by one flat index).
bool dense_like(const Tensor& t, const Tensor& like) {
  return t.defined() && t.dtype() == like.dtype() && t.shape() == like.shape() && t.strides() == like.strides() &&
         (like.is_contiguous() || like.is_contiguous(MemoryFormat::channels_last));
}

// The four hyperparameters as one f64 vector on `device`. Device tensors: device ops (a
// cast and a cat), nothing read on the host. Host tensors (optim's): their values, and a
// device copy kept per value set for the last few sets, so a step whose lr did not change
// copies nothing (a copy from pageable memory may wait for the stream: the GPU would idle
// while the host caught up). The kept tensors are never written, so queued kernels may
// share them.
Tensor hyper_vector(std::span<const Tensor> hyper, Device device) {
  bool host = true;
  for (const Tensor& t : hyper) host = host && t.device().is_cpu();
  if (!host) {
    std::vector<Tensor> parts;
    for (const Tensor& t : hyper) parts.push_back(t.to(device).to(DType::f64).reshape({1}));
    return cat(parts, 0);
  }
  std::vector<double> values;
  for (const Tensor& t : hyper) values.push_back(t.item<double>());
  static std::mutex mutex;
  static std::map<std::pair<int, std::vector<double>>, Tensor> recent;
  std::lock_guard lock(mutex);
  const auto key = std::pair{device.index, values};
  auto it = recent.find(key);
  if (it == recent.end()) {
    if (recent.size() >= 16) recent.clear();
    it = recent.emplace(key, from_vector<double>(values).to(device)).first;
  }
  return it->second;
}

}  // namespace

bool sgd_update_multi_tensor(std::span<const Tensor> in, std::span<const Tensor> p_out,
                             std::span<const Tensor> buf_out, const Attrs& attrs) {
  const auto n = static_cast<int64_t>(p_out.size());
  if (n == 0) return true;
  const DType dt = in[0].dtype();
  if (dt != DType::f32 && dt != DType::f64) return false;
  const bool has_buf = in[static_cast<size_t>(2 * n)].defined();
  for (int64_t k = 0; k < n; ++k) {
    const Tensor& p = in[static_cast<size_t>(k)];
    if (!dense_like(p, p) || !dense_like(in[static_cast<size_t>(n + k)], p) || !dense_like(p_out[static_cast<size_t>(k)], p))
      return false;
    if (has_buf && (!dense_like(in[static_cast<size_t>(2 * n + k)], p) || !dense_like(buf_out[static_cast<size_t>(k)], p)))
      return false;
  }
  const Tensor hyper = hyper_vector(in.subspan(static_cast<size_t>(3 * n), 4), in[0].device());
  const int maximize = attrs.b("maximize"), nesterov = attrs.b("nesterov"), first = attrs.b("first");
  for (int64_t begin = 0; begin < n; begin += kSgdGroup) {
    SgdParams group{};
    long long total = 0;
    const int64_t end = std::min<int64_t>(n, begin + kSgdGroup);
    for (int64_t k = begin; k < end; ++k) {
      const auto s = static_cast<size_t>(k);
      SgdParam& q = group.param[k - begin];
      q.p_out = p_out[s].data_ptr();
      q.buf_out = has_buf ? buf_out[s].data_ptr() : nullptr;
      q.p = in[s].data_ptr();
      q.g = in[static_cast<size_t>(n) + s].data_ptr();
      q.buf = has_buf ? in[static_cast<size_t>(2 * n) + s].data_ptr() : nullptr;
      q.n = in[s].numel();
      q.start = total;
      total += q.n;
    }
    if (total == 0) continue;
    const long long threads = std::min<long long>(total, 65536LL * KernelFamily::kBlock);
    kSgdMulti.launch(dt, in[0].device().index, threads, group, hyper.data_ptr(), total, maximize, nesterov, first);
  }
  return true;
}

}  // namespace kiln::cuda
