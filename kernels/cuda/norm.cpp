// CUDA kernels of batch_norm, batch_norm_backward and batch_norm_stats_update through
// cuDNN's batch-normalization API (CUDNN_BATCHNORM_SPATIAL: per channel over N and every
// spatial position). These are deprecated in cuDNN 9 but still there; layer_norm stays
// without a CUDA kernel here.
//
// Semantics follow kernels/cpu/norm.cpp:
// - an [N, C, ...] input is seen as [N, C, L, 1] (contiguous), so any rank from 2 up works;
//   a 4-d channels_last input stays NHWC (cuDNN's descriptors take its strides, and in f32
//   the NHWC-optimized CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode computes training; its
//   range restriction is the NCHW mode's only), so a channels-last network's batch norms
//   copy nothing; an output not in the input's layout or dtype is written through a buffer
//   copied into it (OutBuffer, copy_);
// - everything is computed in the statistics dtype (f32, or f64 for f64 inputs): 16-bit
//   inputs are converted to f32 first (cuDNN keeps its parameters in f32 for them anyway),
//   and results are converted back into the outputs' dtypes;
// - training saves the batch mean and invstd = 1 / sqrt(biased var + eps), which is what
//   cuDNN's resultSaveMean / resultSaveInvVariance hold; eval saves the running mean and
//   1 / sqrt(running_var + eps);
// - the running statistics' update is cuDNN's: r = (1 - factor) r + factor s with factor =
//   the op's momentum (PyTorch's convention, as the CPU kernel) and the unbiased variance
//   for running_var. batch_norm_stats_update runs the same cuDNN call on copies of the
//   running statistics, so its values equal batch_norm's in-place update.
#include <cmath>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/registry.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

DType stats_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

double momentum_of(const Attrs& a) { return a.has("momentum") ? a.f("momentum") : 0.1; }
double eps_of(const Attrs& a, const char* op) {
  const double eps = a.has("eps") ? a.f("eps") : 1e-5;
  KILN_CHECK(eps >= CUDNN_BN_MIN_EPSILON, "{}: eps {} is below cuDNN's minimum {}", op, eps, CUDNN_BN_MIN_EPSILON);
  return eps;
}

// An [N, C, ...] tensor's [N, C, L] sizes, and whether the call keeps it NHWC: a 4-d
// channels_last input that is not also contiguous (then H * W is L).
struct Channels {
  int64_t n, c, l;
  bool nhwc = false;
  int64_t h = 1, w = 1;
};
Channels channels_of(const Tensor& x) {
  int64_t l = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l *= x.size(d);
  Channels s{x.size(0), x.size(1), l};
  if (x.dim() == 4 && !x.is_contiguous() && dnn::is_channels_last(x)) {
    s.nhwc = true;
    s.h = x.size(2);
    s.w = x.size(3);
  }
  return s;
}

// Training's mode: the NHWC-optimized one for NHWC data in f32 (the statistics dtype of
// the 16-bit floats too; cuDNN's optimized path is for float and half), else spatial.
cudnnBatchNormMode_t training_mode(const Channels& s, DType dt) {
  return s.nhwc && dt == DType::f32 ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
}

// `t` (an input of the call) in the call's layout and dtype dt: itself when it is, else a copy.
Tensor in_call_layout(const Tensor& t, const Channels& s, DType dt) {
  const Tensor converted = t.to(dt);
  return s.nhwc ? dnn::in_layout(converted, true) : converted.contiguous();
}

// The descriptors of one call: the data as [N, C, L, 1] (or [N, C, H, W] NHWC), the
// parameters as [1, C, 1, 1].
struct BnDescs {
  dnn::TensorDesc data, param;
  BnDescs(const Channels& s, DType dt, const char* op) {
    if (s.nhwc) {
      const int64_t sizes[] = {s.n, s.c, s.h, s.w}, strides[] = {s.c * s.l, 1, s.w * s.c, s.c};
      data.set(dt, sizes, strides, op);
    } else {
      const int64_t sizes[] = {s.n, s.c, s.l, 1}, strides[] = {s.c * s.l, s.l, 1, 1};
      data.set(dt, sizes, strides, op);
    }
    const int64_t psizes[] = {1, s.c, 1, 1}, pstrides[] = {s.c, 1, 1, 1};
    param.set(dt, psizes, pstrides, op);
  }
};

// A per-channel tensor in dtype dt, contiguous: `fallback` everywhere when t is undefined.
Tensor param(const Tensor& t, int64_t c, double fallback, DType dt, Device device) {
  if (!t.defined()) return full({c}, fallback, {.dtype = dt, .device = device});
  return t.to(dt).contiguous();
}

// t itself when cuDNN can read and write it as dtype dt, else a converted contiguous copy.
Tensor writable(const Tensor& t, DType dt) {
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor copy = empty(t.shape(), {.dtype = dt, .device = t.device()});
  copy.copy_(t);
  return copy;
}

// A buffer of dtype dt to write `out` through, contiguous (or NHWC with `nhwc`, for data
// of an NHWC call): out itself when it is one, else a new tensor that finish() copies
// (converting) into out.
struct OutBuffer {
  Tensor out, buf;
  OutBuffer(const Tensor& o, DType dt, bool nhwc = false) : out(o) {
    const bool fits = o.dtype() == dt && (nhwc ? dnn::is_channels_last(o) : o.is_contiguous());
    buf = fits ? o : nhwc ? dnn::empty_channels_last(o.shape(), dt, o.device()) : empty(o.shape(), {.dtype = dt, .device = o.device()});
  }
  void* ptr() const { return buf.data_ptr(); }
  void finish() {
    if (!buf.same(out)) out.copy_(buf);
  }
};

void forward_training(cudnnHandle_t h, const Channels& s, const BnDescs& d, DType dt, const Tensor& x, void* y,
                      const Tensor& w, const Tensor& b, double momentum, void* running_mean, void* running_var,
                      double eps, void* save_mean, void* save_invstd, const char* op) {
  const dnn::Scale one(1.0), zero(0.0);
  dnn::check(cudnnBatchNormalizationForwardTraining(h, training_mode(s, dt), one.for_type(dt), zero.for_type(dt),
                                                    d.data.get(), x.data_ptr(), d.data.get(), y, d.param.get(),
                                                    w.data_ptr(), b.data_ptr(), momentum, running_mean, running_var,
                                                    eps, save_mean, save_invstd),
             op);
}

// (input, weight?, bias?, running_mean?, running_var?) -> (out, save_mean, save_invstd)
void batch_norm_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "batch_norm";
  NoGradGuard no_grad;
  const bool training = attrs.b("training");
  const double eps = eps_of(attrs, op);
  const DType sd = stats_dtype(in[0].dtype());
  const Device device = in[0].device();
  const Channels s = channels_of(in[0]);
  const Tensor x = in_call_layout(in[0], s, sd);
  if (s.c == 0) return;
  const Tensor w = param(in[1], s.c, 1.0, sd, device), b = param(in[2], s.c, 0.0, sd, device);
  const bool has_running = in[3].defined();
  OutBuffer y(out[0], sd, s.nhwc), save_mean(out[1], sd), save_invstd(out[2], sd);
  DeviceGuard guard(device.index);
  cudnnHandle_t h = dnn::handle_for(device.index, op);
  if (training) {
    const BnDescs d(s, sd, op);
    // The running statistics are updated in place: through themselves when cuDNN can write
    // them (stats dtype, contiguous), else through copies written back.
    Tensor rm, rv;
    if (has_running) {
      rm = writable(in[3], sd);
      rv = writable(in[4], sd);
    }
    forward_training(h, s, d, sd, x, y.ptr(), w, b, momentum_of(attrs), has_running ? rm.data_ptr() : nullptr,
                     has_running ? rv.data_ptr() : nullptr, eps, save_mean.ptr(), save_invstd.ptr(), op);
    if (has_running && !rm.same(in[3])) Tensor(in[3]).copy_(rm);
    if (has_running && !rv.same(in[4])) Tensor(in[4]).copy_(rv);
  } else {
    const Tensor rm = param(in[3], s.c, 0.0, sd, device), rv = param(in[4], s.c, 1.0, sd, device);
    if (x.numel() > 0) {
      const BnDescs d(s, sd, op);
      const dnn::Scale one(1.0), zero(0.0);
      dnn::check(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, one.for_type(sd),
                                                         zero.for_type(sd), d.data.get(), x.data_ptr(), d.data.get(),
                                                         y.ptr(), d.param.get(), w.data_ptr(), b.data_ptr(),
                                                         rm.data_ptr(), rv.data_ptr(), eps),
                 op);
    }
    save_mean.buf.copy_(rm);
    save_invstd.buf.copy_(rsqrt(add(rv, eps)));
  }
  y.finish();
  save_mean.finish();
  save_invstd.finish();
}

// (input, running_mean, running_var) {momentum} -> (new_running_mean, new_running_var)
void batch_norm_stats_update_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "batch_norm_stats_update";
  NoGradGuard no_grad;
  const DType sd = stats_dtype(in[0].dtype());
  const Device device = in[0].device();
  const Channels s = channels_of(in[0]);
  const Tensor x = in_call_layout(in[0], s, sd);
  if (s.c == 0) return;
  const Tensor w = param({}, s.c, 1.0, sd, device), b = param({}, s.c, 0.0, sd, device);
  // The update is written into fresh copies; the normalized output is thrown away.
  Tensor rm = empty({s.c}, {.dtype = sd, .device = device}), rv = empty({s.c}, {.dtype = sd, .device = device});
  rm.copy_(in[1]);
  rv.copy_(in[2]);
  const Tensor scratch = s.nhwc ? dnn::empty_channels_last(x.shape(), sd, device) : empty(x.shape(), {.dtype = sd, .device = device});
  DeviceGuard guard(device.index);
  const BnDescs d(s, sd, op);
  forward_training(dnn::handle_for(device.index, op), s, d, sd, x, scratch.data_ptr(), w, b, momentum_of(attrs),
                   rm.data_ptr(), rv.data_ptr(), 1e-5, nullptr, nullptr, op);
  Tensor(out[0]).copy_(rm);
  Tensor(out[1]).copy_(rv);
}

// (input, weight?, bias?, running_mean, running_var) -> (out, save_mean, save_invstd,
// new_running_mean, new_running_var): batch_norm's cuDNN call updating copies of the running
// statistics, which are the new values.
void batch_norm_update_kernel(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  // Two contiguous vectors of one dtype: cudaMemcpyAsync, a copy node in a CUDA graph
  // rather than a kernel launch (the cost model counted 106 launches for ResNet-50).
  for (int k : {3, 4}) {
    const Tensor& dst = out[k];
    const Tensor& src = in[k];
    if (dst.same(src)) continue;
    if (dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype() && dst.device() == src.device()) {
      DeviceGuard guard(dst.device().index);
      check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(dst.numel()) * itemsize(dst.dtype()),
                            cudaMemcpyDeviceToDevice, stream_of(dst.device().index)),
            "batch_norm_update");
    } else {
      Tensor(dst).copy_(src);
    }
  }
  const Tensor args[] = {in[0], in[1], in[2], out[3], out[4]};
  batch_norm_kernel(args, out.subspan(0, 3), attrs);
}

// (grad_out, input, weight?, save_mean, save_invstd) -> (grad_input, grad_weight, grad_bias)
void batch_norm_backward_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "batch_norm_backward";
  NoGradGuard no_grad;
  const bool training = attrs.b("training");
  const DType sd = stats_dtype(in[1].dtype());
  const Device device = in[1].device();
  const Channels s = channels_of(in[1]);
  const Tensor x = in_call_layout(in[1], s, sd), dy = in_call_layout(in[0], s, sd);
  if (s.c == 0) return;
  const Tensor w = param(in[2], s.c, 1.0, sd, device);
  const Tensor mean = in[3].to(sd).contiguous(), invstd = in[4].to(sd).contiguous();
  if (!training || x.numel() == 0) {
    // With running statistics the normalization is affine in x, and cuDNN's backward
    // assumes batch statistics: dx = dy w invstd, dw = sum(dy (x - mean)) invstd, db = sum(dy).
    const Tensor dy3 = dy.contiguous().view({s.n, s.c, s.l}), x3 = x.contiguous().view({s.n, s.c, s.l});
    Tensor(out[0]).copy_(mul(dy3, mul(w, invstd).view({1, s.c, 1})).view(x.shape()));
    Tensor(out[1]).copy_(mul(sum(mul(dy3, sub(x3, mean.view({1, s.c, 1}))), {0, 2}), invstd));
    Tensor(out[2]).copy_(sum(dy3, {0, 2}));
    return;
  }
  OutBuffer dx(out[0], sd, s.nhwc), dw(out[1], sd), db(out[2], sd);
  DeviceGuard guard(device.index);
  const BnDescs d(s, sd, op);
  const dnn::Scale one(1.0), zero(0.0);
  // Given the saved statistics, cuDNN does not recompute them (eps is then unused); the mode
  // is the forward's.
  dnn::check(cudnnBatchNormalizationBackward(dnn::handle_for(device.index, op), training_mode(s, sd),
                                             one.for_type(sd), zero.for_type(sd), one.for_type(sd), zero.for_type(sd),
                                             d.data.get(), x.data_ptr(), d.data.get(), dy.data_ptr(), d.data.get(),
                                             dx.ptr(), d.param.get(), w.data_ptr(), dw.ptr(), db.ptr(),
                                             eps_of(attrs, op), mean.data_ptr(), invstd.data_ptr()),
             op);
  dx.finish();
  dw.finish();
  db.finish();
}

struct Registrar {
  Registrar() {
    register_kernel("batch_norm", DeviceType::cuda, batch_norm_kernel);
    register_kernel("batch_norm_stats_update", DeviceType::cuda, batch_norm_stats_update_kernel);
    register_kernel("batch_norm_update", DeviceType::cuda, batch_norm_update_kernel);
    register_kernel("batch_norm_backward", DeviceType::cuda, batch_norm_backward_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
