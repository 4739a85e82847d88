// CUDA kernels of nll_loss, cross_entropy_loss (class-index targets, label smoothing),
// cross_entropy_prob_loss (class-probability targets), mse_loss and their backward ops, with kernels/cpu/loss.cpp's arithmetic: every loss
// element in f64 from the input read as its compute type, written the way the CPU writes
// it. A reduced loss is summed as the CPU's ordered_sum sums it (chunks of 2048 elements in
// order, then the chunks' sums in order), so it is the CPU's number to the bit; only the
// total weight of a weighted mean is summed in chunks here and element by element there
// (equal unless the weights' sums round). No kernel reads a value back to the host.
//
// Unlike the CPU kernels, a class-index target out of [0, classes) that is not ignore_index
// raises no error (finding it would make every call wait for the GPU): its loss element,
// the reduced loss and its gradient row are NaN.
//
// mse_loss with reduction "none" and mse_loss_backward are elementwise and broadcast:
// composed of eager CUDA ops in the CPU kernel's compute dtype and order.
#include <algorithm>
#include <limits>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::f16, DType::bf16};

constexpr long long kChunk = 2048;  // kernels/cpu/loss.cpp's ordered_sum chunk

// The loss of each element of a class-index loss, its target's weight (0 when ignored),
// and with reduction "none" the element itself in the input's dtype.
const KernelFamily kClassIndexElements("class_index_elements", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* x, long long stride_n, long long stride_c, long long stride_s,
                                long long spatial, long long classes, const long long* target,
                                const double* weight, long long ignore_index, double smoothing, long long count,
                                T* out, double* losses, double* weights) {
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= count) return;
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  const long long t = target[e];
  double loss = 0.0, w = 0.0;
  if (t != ignore_index) {
    if (t < 0 || t >= classes) {
      loss = w = nan;
    } else {
      w = weight ? weight[t] : 1.0;
      const T* row = x + (e / spatial) * stride_n + (e % spatial) * stride_s;
      loss = -w * (double)(C)row[t * stride_c];
      if (smoothing != 0.0) {
        double smooth = 0.0;
        for (long long c = 0; c < classes; ++c) smooth -= (weight ? weight[c] : 1.0) * (double)(C)row[c * stride_c];
        loss = (1 - smoothing) * loss + smoothing / (double)classes * smooth;
      }
    }
  }
  if (out) out[e] = T(loss);
  if (losses) losses[e] = loss;
  if (weights) weights[e] = w;
}
)",
                                        kFloats);

// Per chunk of `chunk` elements: the sum of a's (and b's) elements in order.
const KernelFamily kChunkSums("chunk_sums", R"(
extern "C" __global__ void NAME(const double* a, const double* b, long long count, long long chunk, double* sums_a,
                                double* sums_b) {
  const long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long begin = c * chunk;
  if (begin >= count) return;
  const long long end = min(count, begin + chunk);
  double sa = 0.0, sb = 0.0;
  for (long long i = begin; i < end; ++i) {
    sa += a[i];
    if (b) sb += b[i];
  }
  sums_a[c] = sa;
  if (b) sums_b[c] = sb;
}
)",
                                {DType::f64});

// Per chunk of mse_loss's contiguous operands: the sum of the squared differences in f64.
const KernelFamily kMseChunks("mse_chunks", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* a, const T* b, long long count, long long chunk, double* sums) {
  const long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long begin = c * chunk;
  if (begin >= count) return;
  const long long end = min(count, begin + chunk);
  double s = 0.0;
  for (long long i = begin; i < end; ++i) {
    const double d = (double)(C)a[i] - (double)(C)b[i];
    s += d * d;
  }
  sums[c] = s;
}
)",
                                kFloats);

// One thread: adds the parts in order and writes the reduced loss (divide: 0 the sum, 1 the
// mean over the total weight, 2 the mean over `count`, NaN when it is 0) into out, and the
// backward's scale of grad_out (1 / total weight for divide 1, else 1) into scale.
const KernelFamily kOrderedFinish("ordered_finish", R"(
typedef SCALAR T;
extern "C" __global__ void NAME(const double* losses, const double* weights, long long parts, int divide,
                                double count, T* out, double* scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0, total = 0.0;
  if (losses)
    for (long long i = 0; i < parts; ++i) s += losses[i];
  if (weights)
    for (long long i = 0; i < parts; ++i) total += weights[i];
  double r = s;
  if (divide == 1) r = s / total;
  if (divide == 2) r = count == 0.0 ? __longlong_as_double(0x7ff8000000000000LL) : s / count;
  if (out) *out = T(r);
  if (scale) *scale = divide == 1 ? 1.0 / total : 1.0;
}
)",
                                    kFloats);

// One thread per element of the gradient (contiguous [N, C, S]): the CPU kernel's formula.
const KernelFamily kClassIndexBackward("class_index_backward", R"(
typedef SCALAR T;
extern "C" __global__ void NAME(const double* grad, int grad_per_element, const double* scale,
                                const long long* target, const double* weight, long long ignore_index,
                                double smoothing, long long classes, long long spatial, long long total, T* out) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long row = classes * spatial;
  const long long c = (j % row) / spatial;
  const long long i = (j / row) * spatial + j % spatial;
  const long long t = target[i];
  const double g = (grad_per_element ? grad[i] : grad[0]) * (scale ? *scale : 1.0);
  const bool ignored = t == ignore_index;
  double v;
  if (!ignored && (t < 0 || t >= classes)) {
    v = __longlong_as_double(0x7ff8000000000000LL);
  } else {
    const double w = weight ? weight[c] : 1.0;
    const double smooth = ignored ? 0.0 : -smoothing / (double)classes * g;
    v = smooth * w;
    if (!ignored && c == t) v -= (1 - smoothing) * w * g;
  }
  out[j] = T(v);
}
)",
                                         kFloats);

// cross_entropy_prob_loss's element e (of count over [N, C, S] views of x and the target,
// each with its strides): -sum over c of w(c) p(c) x[c], p(c) the smoothed target
// probability, in the CPU kernel's order; with reduction "none" the element in x's dtype.
const KernelFamily kProbElements("prob_elements", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* x, long long xn, long long xc, long long xs, const T* target, long long tn,
                                long long tc, long long ts, long long spatial, long long classes,
                                const double* weight, double smoothing, long long count, T* out, double* losses) {
  const long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= count) return;
  const T* xr = x + (e / spatial) * xn + (e % spatial) * xs;
  const T* tr = target + (e / spatial) * tn + (e % spatial) * ts;
  double loss = 0.0;
  for (long long c = 0; c < classes; ++c) {
    const double p = (double)(C)tr[c * tc] * (1 - smoothing) + smoothing / (double)classes;
    loss -= (weight ? weight[c] : 1.0) * p * (double)(C)xr[c * xc];
  }
  if (out) out[e] = T(loss);
  if (losses) losses[e] = loss;
}
)",
                                   kFloats);

// One thread per element j of the gradient (contiguous [N, C, S]): -w(c) p(c) g, g the
// element's gradient (or the reduced loss's, times 1 / count for a mean).
const KernelFamily kProbBackward("prob_backward", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const double* grad, int grad_per_element, double scale, const T* target,
                                long long tn, long long tc, long long ts, const double* weight, double smoothing,
                                long long classes, long long spatial, long long total, T* out) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long row = classes * spatial;
  const long long c = (j % row) / spatial;
  const long long i = (j / row) * spatial + j % spatial;
  const double g = (grad_per_element ? grad[i] : grad[0]) * scale;
  const double p = (double)(C)target[(i / spatial) * tn + c * tc + (i % spatial) * ts] * (1 - smoothing) +
                   smoothing / (double)classes;
  out[j] = T(-(weight ? weight[c] : 1.0) * p * g);
}
)",
                                   kFloats);

enum class Reduction { none, mean, sum };

Reduction reduction_of(const Attrs& a) {
  const std::string& r = a.str("reduction");
  return r == "none" ? Reduction::none : r == "sum" ? Reduction::sum : Reduction::mean;
}

const void* ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mut_ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

Tensor f64_buffer(int64_t n, const Device& device) { return empty({n}, {.dtype = DType::f64, .device = device}); }

// The out tensor, or a contiguous buffer of its shape and dtype that the caller copies into it.
Tensor contiguous_target(const Tensor& out) {
  return out.is_contiguous() ? out : empty(out.shape(), {.dtype = out.dtype(), .device = out.device()});
}
void finish_target(const Tensor& out, const Tensor& target) {
  if (!target.same(out)) Tensor(out).copy_(target);
}

// Adds `losses` (and `weights`, either may be undefined) of `count` elements in the CPU's
// order and writes the result: the reduced loss into `out` (a 0-d tensor of `dtype`) and/or
// the backward's scale into `scale`.
void ordered_reduce(const Tensor& losses, const Tensor& weights, long long count, int divide, DType dtype,
                    const Tensor& out, const Tensor& scale, int device) {
  Tensor l = losses, w = weights;
  long long parts = count;
  if (count > kChunk) {
    // Chunk sums first; with at most one chunk the finish kernel's sum is the chunk's.
    parts = (count + kChunk - 1) / kChunk;
    const Tensor first = l.defined() ? l : w, second = l.defined() ? w : Tensor();
    const Tensor first_sums = f64_buffer(parts, first.device());
    const Tensor second_sums = second.defined() ? f64_buffer(parts, first.device()) : Tensor();
    kChunkSums.launch(DType::f64, device, parts, ptr(first), ptr(second), count, kChunk, mut_ptr(first_sums),
                      mut_ptr(second_sums));
    const bool has_losses = l.defined();
    l = has_losses ? first_sums : Tensor();
    w = has_losses ? second_sums : first_sums;
  }
  const Tensor o = out.defined() ? contiguous_target(out) : Tensor();
  kOrderedFinish.launch(dtype, device, 1, ptr(l), ptr(w), parts, divide, static_cast<double>(count), mut_ptr(o),
                        mut_ptr(scale));
  if (out.defined()) finish_target(out, o);
}

// ---- class-index losses ----

// The input seen as [N, C, S] (a view when its strides allow) and the problem's attributes.
struct ClassIndexProblem {
  Tensor x;  // [N, C, S]
  Tensor target, weight;  // contiguous i64; f64 or undefined
  long long n, classes, spatial, count;
  long long ignore_index;
  double smoothing;
  Reduction reduction;
  int device;

  ClassIndexProblem(const Tensor& input, const Tensor& target_in, const Tensor& weight_in, const Attrs& a)
      : target(target_in.contiguous()),
        weight(weight_in.defined() ? weight_in.to(DType::f64).contiguous() : Tensor()),
        ignore_index(a.i("ignore_index")),
        smoothing(a.has("label_smoothing") ? a.f("label_smoothing") : 0.0),
        reduction(reduction_of(a)),
        device(input.device().index) {
    classes = input.dim() == 1 ? input.size(0) : input.size(1);
    n = input.dim() == 1 ? 1 : input.size(0);
    spatial = 1;
    for (int64_t d = 2; d < input.dim(); ++d) spatial *= input.size(d);
    x = input.reshape({n, classes, spatial});
    count = n * spatial;
  }
};

void class_index_loss(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const ClassIndexProblem p(in[0], in[1], in[2], attrs);
  const DType t = in[0].dtype();
  if (p.reduction == Reduction::none) {
    const Tensor y = contiguous_target(out[0]);
    kClassIndexElements.launch(t, p.device, p.count, ptr(p.x), static_cast<long long>(p.x.stride(0)),
                               static_cast<long long>(p.x.stride(1)), static_cast<long long>(p.x.stride(2)),
                               p.spatial, p.classes, ptr(p.target), ptr(p.weight), p.ignore_index, p.smoothing,
                               p.count, mut_ptr(y), static_cast<void*>(nullptr), static_cast<void*>(nullptr));
    finish_target(out[0], y);
    return;
  }
  const Tensor losses = f64_buffer(p.count, in[0].device());
  const Tensor weights = p.reduction == Reduction::mean ? f64_buffer(p.count, in[0].device()) : Tensor();
  kClassIndexElements.launch(t, p.device, p.count, ptr(p.x), static_cast<long long>(p.x.stride(0)),
                             static_cast<long long>(p.x.stride(1)), static_cast<long long>(p.x.stride(2)), p.spatial,
                             p.classes, ptr(p.target), ptr(p.weight), p.ignore_index, p.smoothing, p.count,
                             static_cast<void*>(nullptr), mut_ptr(losses), mut_ptr(weights));
  ordered_reduce(losses, weights, p.count, p.reduction == Reduction::mean ? 1 : 0, t, out[0], Tensor(), p.device);
}

// (grad_out, log_probs, target, weight?) -> grad_log_probs
void class_index_backward(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const ClassIndexProblem p(in[1], in[2], in[3], attrs);
  const DType t = out[0].dtype();
  const Tensor gx = contiguous_target(out[0]);
  Tensor scale;
  if (p.reduction == Reduction::mean) {
    // 1 / the total weight of the targets that are not ignored, on the device.
    const Tensor weights = f64_buffer(p.count, in[1].device());
    kClassIndexElements.launch(in[1].dtype(), p.device, p.count, ptr(p.x), static_cast<long long>(p.x.stride(0)),
                               static_cast<long long>(p.x.stride(1)), static_cast<long long>(p.x.stride(2)),
                               p.spatial, p.classes, ptr(p.target), ptr(p.weight), p.ignore_index, 0.0, p.count,
                               static_cast<void*>(nullptr), static_cast<void*>(nullptr), mut_ptr(weights));
    scale = f64_buffer(1, in[1].device());
    ordered_reduce(Tensor(), weights, p.count, 1, t, Tensor(), scale, p.device);
  }
  const Tensor g = in[0].to(DType::f64).contiguous();
  const int per_element = p.reduction == Reduction::none ? 1 : 0;
  kClassIndexBackward.launch(t, p.device, static_cast<long long>(gx.numel()), ptr(g), per_element, ptr(scale),
                             ptr(p.target), ptr(p.weight), p.ignore_index, p.smoothing, p.classes, p.spatial,
                             static_cast<long long>(gx.numel()), mut_ptr(gx));
  finish_target(out[0], gx);
}

// ---- cross_entropy_prob_loss: class probabilities as the target ----

// The log-probabilities and the target (in their dtype) as [N, C, S] views, the weight.
struct ProbProblem {
  Tensor x, target, weight;
  long long classes, spatial, count;
  double smoothing;
  Reduction reduction;
  int device;

  ProbProblem(const Tensor& input, const Tensor& target_in, const Tensor& weight_in, const Attrs& a)
      : weight(weight_in.defined() ? weight_in.to(DType::f64).contiguous() : Tensor()),
        smoothing(a.f("label_smoothing")),
        reduction(reduction_of(a)),
        device(input.device().index) {
    classes = input.dim() == 1 ? input.size(0) : input.size(1);
    const long long n = input.dim() == 1 ? 1 : input.size(0);
    spatial = 1;
    for (int64_t d = 2; d < input.dim(); ++d) spatial *= input.size(d);
    x = input.reshape({n, classes, spatial});
    target = target_in.to(input.dtype()).reshape({n, classes, spatial});
    count = n * spatial;
  }
  long long stride(const Tensor& t, int d) const { return static_cast<long long>(t.stride(d)); }
};

void prob_loss(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const ProbProblem p(in[0], in[1], in[2], attrs);
  const DType t = in[0].dtype();
  auto elements = [&](const Tensor& y, const Tensor& losses) {
    kProbElements.launch(t, p.device, p.count, ptr(p.x), p.stride(p.x, 0), p.stride(p.x, 1), p.stride(p.x, 2),
                         ptr(p.target), p.stride(p.target, 0), p.stride(p.target, 1), p.stride(p.target, 2), p.spatial,
                         p.classes, ptr(p.weight), p.smoothing, p.count, mut_ptr(y), mut_ptr(losses));
  };
  if (p.reduction == Reduction::none) {
    const Tensor y = contiguous_target(out[0]);
    elements(y, Tensor());
    finish_target(out[0], y);
    return;
  }
  if (p.reduction == Reduction::mean && in[0].numel() == 0) {  // the CPU's NaN, with no launch
    Tensor(out[0]).fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const Tensor losses = f64_buffer(std::max<long long>(p.count, 1), in[0].device());
  elements(Tensor(), losses);
  ordered_reduce(losses, Tensor(), p.count, p.reduction == Reduction::mean ? 2 : 0, t, out[0], Tensor(), p.device);
}

// (grad_out, log_probs, target_probs, weight?) -> grad_log_probs
void prob_loss_backward(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const ProbProblem p(in[1], in[2], in[3], attrs);
  const Tensor gx = contiguous_target(out[0]);
  const Tensor g = in[0].to(DType::f64).contiguous();
  const double scale = p.reduction == Reduction::mean ? 1.0 / static_cast<double>(p.count) : 1.0;
  kProbBackward.launch(out[0].dtype(), p.device, static_cast<long long>(gx.numel()), ptr(g),
                       p.reduction == Reduction::none ? 1 : 0, scale, ptr(p.target), p.stride(p.target, 0),
                       p.stride(p.target, 1), p.stride(p.target, 2), ptr(p.weight), p.smoothing, p.classes, p.spatial,
                       static_cast<long long>(gx.numel()), mut_ptr(gx));
  finish_target(out[0], gx);
}

// ---- mse_loss ----

// The dtype the CPU kernel computes in: the inputs' result type, made floating.
DType result_dtype(Span in) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : in) metas.push_back(TensorMeta::of(t));
  const DType t = result_type(metas);
  return is_floating(t) ? t : kDefaultFloat;
}

// f32 for the 16-bit floats: the CPU kernel's elementwise arithmetic type.
DType arithmetic_dtype(DType t) { return is_reduced_float(t) ? DType::f32 : t; }

void mse(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const DType dtype = result_dtype(in);
  const Reduction reduction = reduction_of(attrs);
  if (reduction == Reduction::none) {
    const DType c = arithmetic_dtype(dtype);
    const Tensor d = in[0].to(c) - in[1].to(c);
    Tensor(out[0]).copy_(d * d);
    return;
  }
  // The operands broadcast and contiguous in the result dtype (a copy only when needed).
  const Shape shapes[] = {in[0].shape(), in[1].shape()};
  const Shape shape = broadcast_shapes(shapes, "mse_loss");
  const Tensor a = in[0].to(dtype).expand(shape).contiguous(), b = in[1].to(dtype).expand(shape).contiguous();
  const long long count = a.numel();
  const int device = a.device().index;
  const long long parts = (count + kChunk - 1) / kChunk;
  const Tensor sums = f64_buffer(std::max<long long>(parts, 1), a.device());
  kMseChunks.launch(dtype, device, parts, ptr(a), ptr(b), count, kChunk, mut_ptr(sums));
  const Tensor o = contiguous_target(out[0]);
  kOrderedFinish.launch(out[0].dtype(), device, 1, ptr(sums), static_cast<const void*>(nullptr), parts,
                        reduction == Reduction::mean ? 2 : 0, static_cast<double>(count), mut_ptr(o),
                        static_cast<void*>(nullptr));
  finish_target(out[0], o);
}

// (grad_out, input, target) -> grad_input = k (input - target) grad_out, k = 2 or 2 / numel,
// in the CPU kernel's order and compute dtype.
void mse_backward(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const DType dtype = result_dtype(in.subspan(1));
  const DType c = arithmetic_dtype(dtype);
  const double scale = reduction_of(attrs) == Reduction::mean ? 2.0 / static_cast<double>(out[0].numel()) : 2.0;
  // k rounded to the compute dtype first, as the CPU kernel's C k = scale.
  const double k = c == DType::f32 ? static_cast<double>(static_cast<float>(scale)) : scale;
  const Tensor g = in[0].to(dtype).to(c), a = in[1].to(dtype).to(c), b = in[2].to(dtype).to(c);
  Tensor(out[0]).copy_(mul(a - b, k) * g);
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("nll_loss", cuda, class_index_loss);
    register_kernel("cross_entropy_loss", cuda, class_index_loss);
    register_kernel("nll_loss_backward", cuda, class_index_backward);
    register_kernel("cross_entropy_loss_backward", cuda, class_index_backward);
    register_kernel("cross_entropy_prob_loss", cuda, prob_loss);
    register_kernel("cross_entropy_prob_loss_backward", cuda, prob_loss_backward);
    register_kernel("mse_loss", cuda, mse);
    register_kernel("mse_loss_backward", cuda, mse_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
