#include "kernels/cuda/optim.h"

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/optim_ops.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/optim_factors.h"
#include "kernels/scalar.h"

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
static_assert(sizeof(SgdParam) == 56 && sizeof(SgdParams) + sizeof(scalar::SgdFactors<double>) + 64 <= 4096);

// The element update is kernels/scalar.h's. Its factors are those of kernels/optim_factors.h,
// but the numbers come from `hyper` (lr, momentum, dampening, weight_decay: f64 in device
// memory), read by the kernel when it runs: a CUDA graph that captured the launch then
// replays it with each step's lr, where factors passed by value would replay the captured
// step's. Only the flags come from the host (`factors`). The factors are computed in f64 as
// the host computes them (1 - dampening, weight_decay != 0) and rounded to T as the CPU
// kernel rounds them: each element's result is the CPU's bit for bit (NVRTC compiles
// without FMA contraction).
const KernelFamily kSgdMulti("sgd_multi", R"(
#include "kernels/scalar.h"
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
extern "C" __global__ void NAME(const SgdParams group, const kiln::scalar::SgdFactors<double> flags,
                               const double* hyper, long long total, const float* found_inf) {
  kiln::scalar::SgdFactors<double> factors = flags;
  factors.lr = hyper[0];
  factors.momentum = hyper[1];
  factors.one_minus_dampening = 1.0 - hyper[2];
  factors.weight_decay = hyper[3];
  factors.decay = hyper[3] != 0.0;
  const kiln::scalar::SgdFactors<T> f = kiln::scalar::in_dtype<T>(factors);
  // A skipped step (mixed precision's found_inf set): the pure form returns its inputs, the
  // in-place form (outputs are the inputs) writes nothing.
  const bool skip = found_inf && *found_inf != 0.0f;
  const long long stride = (long long)gridDim.x * blockDim.x;
  int k = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= group.param[k].start + group.param[k].n) ++k;
    const SgdParam& q = group.param[k];
    const long long j = i - q.start;
    if (skip) {
      if (q.p_out != q.p) q.p_out[j] = q.p[j];
      if (q.buf_out && q.buf_out != q.buf) q.buf_out[j] = q.buf[j];
    } else if (q.buf_out) {
      T b = q.buf[j];
      q.p_out[j] = kiln::scalar::sgd_update(q.p[j], q.g[j], &b, f);
      q.buf_out[j] = b;
    } else {
      q.p_out[j] = kiln::scalar::sgd_update<T>(q.p[j], q.g[j], nullptr, f);
    }
  }
}
)",
                                {DType::f32, DType::f64});

// AdamW: parameter k's factors come from its own step count, in f64, and are rounded to T
// in the kernel as the CPU kernel rounds them; the element update is kernels/scalar.h's.
// Where the step counts and hyperparameters are host tensors (the eager default) the host
// computes the factors into each AdamParam; where they live on the device (capturable
// AdamW), adamw_factors below computes them there into `factors`, one row per parameter of
// the launch, so that nothing is read back to the host and a captured CUDA graph replays
// each step's counts and lr.
struct AdamParam {
  void *p_out, *m_out, *v_out, *vmax_out;  // vmax_out null without amsgrad
  const void *p, *g, *m, *v, *vmax;
  long long n, start;
  scalar::AdamWFactors<double> factors;  // unused when the kernel is given device factors
};
struct AdamParams {
  AdamParam param[kAdamGroup];
};
static_assert(sizeof(AdamParam) == 152 && sizeof(AdamParams) + 64 <= 4096);

const KernelFamily kAdamMulti("adamw_multi", R"(
#include "kernels/scalar.h"
typedef SCALAR T;
struct AdamParam {
  T *p_out, *m_out, *v_out, *vmax_out;
  const T *p, *g, *m, *v, *vmax;
  long long n, start;
  kiln::scalar::AdamWFactors<double> factors;
};
struct AdamParams {
  AdamParam param[)" + std::to_string(kAdamGroup) + R"(];
};
// factors: parameter k's in factors[k] (computed on the device by adamw_factors), or null:
// each AdamParam's own.
extern "C" __global__ void NAME(const AdamParams group, long long total, const float* found_inf,
                               const kiln::scalar::AdamWFactors<double>* factors) {
  const bool skip = found_inf && *found_inf != 0.0f;  // as in sgd_multi
  const long long stride = (long long)gridDim.x * blockDim.x;
  int k = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= group.param[k].start + group.param[k].n) ++k;
    const AdamParam& q = group.param[k];
    const long long j = i - q.start;
    if (skip) {
      if (q.p_out != q.p) q.p_out[j] = q.p[j];
      if (q.m_out != q.m) q.m_out[j] = q.m[j];
      if (q.v_out != q.v) q.v_out[j] = q.v[j];
      if (q.vmax_out && q.vmax_out != q.vmax) q.vmax_out[j] = q.vmax[j];
      continue;
    }
    T m = q.m[j], v = q.v[j], vmax = q.vmax_out ? q.vmax[j] : T(0);
    q.p_out[j] = kiln::scalar::adamw_update(q.p[j], q.g[j], m, v, q.vmax_out ? &vmax : nullptr,
                                            kiln::scalar::in_dtype<T>(factors ? factors[k] : q.factors));
    q.m_out[j] = m;
    q.v_out[j] = v;
    if (q.vmax_out) q.vmax_out[j] = vmax;
  }
}
)",
                                 {DType::f32, DType::f64});

// Where the numbers of one adamw_multi launch's factors are, each an f64 in device memory:
// its parameters' step counts and the hyperparameters (lr, beta1, beta2, eps, weight_decay).
// Pointers to the tensors themselves: no copy gathers them first.
struct AdamFactorInputs {
  const double* step[kAdamGroup];
  const double* hyper[5];
};
static_assert(sizeof(AdamFactorInputs) + 32 <= 4096 && sizeof(scalar::AdamWFactors<double>) == 64);

// One thread per parameter of the launch: its factors from its step count as the host's
// adamw_factors computes them (the same function, in f64), for adamw_multi to read. A
// launch of its own rather than a prologue in adamw_multi: every block of that kernel would
// otherwise compute every parameter's factors (pow twice each).
const KernelFamily kAdamFactors("adamw_factors", R"(
#include "kernels/scalar.h"
struct AdamFactorInputs {
  const double* step[)" + std::to_string(kAdamGroup) + R"(];
  const double* hyper[5];
};
extern "C" __global__ void NAME(const AdamFactorInputs in, int count, int maximize,
                               kiln::scalar::AdamWFactors<double>* factors) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= count) return;
  factors[k] = kiln::scalar::adamw_factors(*in.step[k], *in.hyper[0], *in.hyper[1], *in.hyper[2], *in.hyper[3],
                                           *in.hyper[4], maximize != 0);
}
)",
                                   {DType::f64});

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

// The found_inf input at in[at], if any, where the kernels read it: on the parameters'
// device (a CPU found_inf with CUDA parameters is copied there first; the optimizers keep it
// on the device). `keep` holds the copy. Null without one.
const float* found_inf_on_device(std::span<const Tensor> in, size_t at, Tensor& keep) {
  if (in.size() <= at || !in[at].defined()) return nullptr;
  keep = in[at].to(in[0].device());
  return keep.data_ptr<float>();
}

// SGD's lr, momentum, dampening and weight_decay (in[at..at+3]) as f64[4] on `device`, where
// sgd_multi reads them: one copy from the host when they are host tensors (the eager
// optimizers keep them there), one small kernel when they are on the device already (a
// whole training step compiled for CUDA graphs puts them there: Optimizer::move_hyperparameters).
Tensor sgd_hyper_on_device(std::span<const Tensor> in, size_t at, Device device) {
  std::vector<Tensor> values(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + 4));
  bool on_host = true;
  for (Tensor& v : values) {
    on_host = on_host && v.device().is_cpu();
    v = v.to(DType::f64);
  }
  if (on_host) return stack(values).to(device);
  for (Tensor& v : values) v = v.to(device);
  return stack(values);
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
  // The flags; the numbers are the kernel's to read (sgd_multi).
  const scalar::SgdFactors<double> flags{0, 0, 0, 0, false, attrs.b("nesterov"), attrs.b("maximize"), attrs.b("first")};
  const Tensor hyper = fast.empty() ? Tensor() : sgd_hyper_on_device(in, static_cast<size_t>(3 * n), in[0].device());
  Tensor keep;
  const float* found_inf = found_inf_on_device(in, static_cast<size_t>(3 * n + 4), keep);
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
        kSgdMulti.launch(in[0].dtype(), in[0].device().index, threads, group, flags, hyper.data_ptr<double>(), total,
                         found_inf);
      });
  return rest;
}

std::vector<int64_t> adamw_update_multi_tensor(std::span<const Tensor> in, const std::array<std::span<const Tensor>, 4>& out,
                                               const Attrs& attrs, AdamWFactorsOn where) {
  const auto n = static_cast<int64_t>(out[0].size());
  const auto at = [&](int64_t role, int64_t k) -> const Tensor& { return in[static_cast<size_t>(role * n + k)]; };
  const bool amsgrad = at(4, 0).defined();
  const auto [fast, rest] = split_params(n, in[0], [&](int64_t k) {
    const auto s = static_cast<size_t>(k);
    std::vector<Tensor> t = {at(0, k), at(1, k), at(2, k), at(3, k), out[0][s], out[1][s], out[2][s]};
    if (amsgrad) t.insert(t.end(), {at(4, k), out[3][s]});
    return t;
  });
  const std::span<const Tensor> hyper = in.subspan(static_cast<size_t>(6 * n), 5);
  if (where == AdamWFactorsOn::automatic) {
    bool on_host = true;
    for (int64_t k : fast) on_host = on_host && at(5, k).device().is_cpu();
    for (const Tensor& h : hyper) on_host = on_host && h.device().is_cpu();
    where = on_host ? AdamWFactorsOn::host : AdamWFactorsOn::device;
  }
  const bool on_device = where == AdamWFactorsOn::device && !fast.empty();
  const Device device = in[0].device();
  // Device factors: the hyperparameters and every step count as f64 on the device (no copy
  // when they are there already), and a row of factors per parameter.
  std::vector<Tensor> device_hyper, steps;
  if (on_device) {
    for (const Tensor& h : hyper) device_hyper.push_back(h.to(DType::f64).to(device));
    for (int64_t k : fast) steps.push_back(at(5, k).to(DType::f64).to(device));
  }
  const int64_t launches = (static_cast<int64_t>(fast.size()) + kAdamGroup - 1) / kAdamGroup;
  constexpr int64_t kRow = sizeof(scalar::AdamWFactors<double>) / sizeof(double);
  const Tensor factors =
      on_device ? empty({launches * kAdamGroup * kRow}, {.dtype = DType::f64, .device = device}) : Tensor();
  Tensor keep;
  const float* found_inf = found_inf_on_device(in, static_cast<size_t>(6 * n + 5), keep);
  // How many parameters for_each_group has filled in. A launch follows its group's fills,
  // so its parameters are fast[first, first + count), `first` the start of the last group
  // filled (counting launches instead would go wrong after a group of empty parameters,
  // which is not launched).
  int64_t filled = 0;
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
        if (!on_device) q.factors = adamw_factors(at(5, k), hyper, attrs);
        ++filled;
        return at(0, k).numel();
      },
      [&](const AdamParams& group, long long total, long long threads) {
        scalar::AdamWFactors<double>* rows = nullptr;
        if (on_device) {
          const int64_t first = (filled - 1) / kAdamGroup * kAdamGroup;
          rows = reinterpret_cast<scalar::AdamWFactors<double>*>(factors.data_ptr<double>() + first * kRow);
          const int count = static_cast<int>(std::min<int64_t>(kAdamGroup, static_cast<int64_t>(fast.size()) - first));
          AdamFactorInputs inputs{};
          for (int e = 0; e < count; ++e) inputs.step[e] = steps[static_cast<size_t>(first + e)].data_ptr<double>();
          for (size_t h = 0; h < 5; ++h) inputs.hyper[h] = device_hyper[h].data_ptr<double>();
          kAdamFactors.launch(DType::f64, device.index, count, inputs, count, static_cast<int>(attrs.b("maximize")), rows);
        }
        kAdamMulti.launch(in[0].dtype(), device.index, threads, group, total, found_inf,
                          static_cast<const scalar::AdamWFactors<double>*>(rows));
      });
  return rest;
}

namespace {

using Span = std::span<const Tensor>;

// One parameter's update through its multi-tensor function (count 1: the single op's inputs
// are the multi op's): update(in, out) launches it and returns the parameters it left,
// whose tensors do not share one dense memory order. Those run again on contiguous copies,
// which are then copied into the outputs. out: one tensor per output role, undefined where
// the role is absent.
template <class Update>
void update_one(const char* op, Span in, const std::vector<Tensor>& out, Update update) {
  if (update(in, Span(out)).empty()) return;
  std::vector<Tensor> dense_in, dense_out;
  for (const Tensor& t : in) dense_in.push_back(t.defined() ? t.contiguous() : t);
  for (const Tensor& t : out)
    dense_out.push_back(!t.defined() || t.is_contiguous() ? t : empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}));
  KILN_CHECK(update(Span(dense_in), Span(dense_out)).empty(),
             "{}: CUDA kernel: param {} and its other tensors are not f32 or f64 of one dtype and device", op,
             in[0].meta_str());
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].defined() && !dense_out[i].same(out[i])) Tensor(out[i]).copy_(dense_out[i]);
}

// in: (param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay).
void sgd_one(Span in, const Tensor& p_out, const Tensor& buf_out, const Attrs& attrs) {
  update_one("sgd_update", in, {p_out, buf_out}, [&](Span i, Span o) {
    return sgd_update_multi_tensor(i, o.subspan(0, 1), o[1].defined() ? o.subspan(1, 1) : Span{}, attrs);
  });
}

// in: (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step, lr, beta1, beta2, eps,
// weight_decay); out: the new param, exp_avg, exp_avg_sq and max_exp_avg_sq (undefined
// without amsgrad).
void adamw_one(Span in, const std::vector<Tensor>& out, const Attrs& attrs) {
  update_one("adamw_update", in, out, [&](Span i, Span o) {
    return adamw_update_multi_tensor(i, {o.subspan(0, 1), o.subspan(1, 1), o.subspan(2, 1), o.subspan(3, 1)}, attrs);
  });
}

void sgd_update_inplace(Span in, Span, const Attrs& attrs) { sgd_one(in, in[0], in[2], attrs); }
void sgd_update(Span in, Span out, const Attrs& attrs) {
  sgd_one(in, out[0], out.size() > 1 ? out[1] : Tensor(), attrs);
}
void adamw_update_inplace(Span in, Span, const Attrs& attrs) { adamw_one(in, {in[0], in[2], in[3], in[4]}, attrs); }
void adamw_update(Span in, Span out, const Attrs& attrs) {
  adamw_one(in, {out[0], out[1], out[2], out.size() > 3 ? out[3] : Tensor()}, attrs);
}

// The multi-tensor forms: a group's parameters in a few launches where their tensors are
// dense in one memory order, the others one at a time as the single ops (the same numbers).
void sgd_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const bool has_buf = in[static_cast<size_t>(2 * n)].defined();
  const Span params = in.subspan(0, static_cast<size_t>(n));
  const Span buffers = has_buf ? in.subspan(static_cast<size_t>(2 * n), static_cast<size_t>(n)) : Span{};
  for (int64_t k : sgd_update_multi_tensor(in, params, buffers, attrs)) {
    const std::vector<Tensor> single = sgd_single_inputs(in, n, k);
    sgd_one(single, single[0], single[2], attrs);
  }
}
// out: (new_param x N, new_momentum_buffer x N if given).
void sgd_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const Span params = out.subspan(0, static_cast<size_t>(n));
  const Span buffers = static_cast<int64_t>(out.size()) > n ? out.subspan(static_cast<size_t>(n)) : Span{};
  for (int64_t k : sgd_update_multi_tensor(in, params, buffers, attrs)) {
    const Tensor buf = static_cast<int64_t>(out.size()) > n ? out[static_cast<size_t>(n + k)] : Tensor();
    sgd_one(sgd_single_inputs(in, n, k), out[static_cast<size_t>(k)], buf, attrs);
  }
}
void adamw_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const auto role = [&](int64_t r) { return in.subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)); };
  const bool amsgrad = in[static_cast<size_t>(4 * n)].defined();
  for (int64_t k : adamw_update_multi_tensor(in, {role(0), role(2), role(3), amsgrad ? role(4) : Span{}}, attrs)) {
    const std::vector<Tensor> single = adamw_single_inputs(in, n, k);
    adamw_one(single, {single[0], single[2], single[3], single[4]}, attrs);
  }
}
// out: (new_param x N, new_exp_avg x N, new_exp_avg_sq x N, new_max_exp_avg_sq x N if given).
void adamw_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const auto role = [&](int64_t r) {
    return static_cast<int64_t>(out.size()) >= (r + 1) * n ? out.subspan(static_cast<size_t>(r * n), static_cast<size_t>(n))
                                                            : Span{};
  };
  for (int64_t k : adamw_update_multi_tensor(in, {role(0), role(1), role(2), role(3)}, attrs)) {
    std::vector<Tensor> outs;
    for (int64_t r = 0; r < 4; ++r) {
      const auto i = static_cast<size_t>(r * n + k);
      outs.push_back(i < out.size() ? out[i] : Tensor());
    }
    adamw_one(adamw_single_inputs(in, n, k), outs, attrs);
  }
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("sgd_update_", cuda, sgd_update_inplace);
    register_kernel("sgd_update", cuda, sgd_update);
    register_kernel("adamw_update_", cuda, adamw_update_inplace);
    register_kernel("adamw_update", cuda, adamw_update);
    register_kernel("sgd_update_multi_", cuda, sgd_update_multi_inplace);
    register_kernel("sgd_update_multi", cuda, sgd_update_multi);
    register_kernel("adamw_update_multi_", cuda, adamw_update_multi_inplace);
    register_kernel("adamw_update_multi", cuda, adamw_update_multi);
  }
} registrar;

}  // namespace

}  // namespace kiln::cuda
