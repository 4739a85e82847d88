// CUDA kernels of the pooling ops, with kernels/cpu/pool.cpp's semantics. 16-bit inputs are
// computed in f32 and rounded once into the output, as on the CPU.
//
// - max_pool2d must give the flat index of each maximum (the op's second output), which
//   cuDNN's pooling does not give, and must let NaN win and keep the first maximum on ties:
//   hand-written kernels do it, one thread per output element, walking the window exactly
//   as the CPU kernel does, on NCHW planes or on channels_last (NHWC) data as it is (the
//   layout of the input decides; outputs in another layout are written through a buffer).
// - max_pool2d_backward scatters grad_out to the indices with atomic adds into an f32 (f64)
//   buffer laid out as grad_input (NCHW or NHWC): the op has no window attributes to gather
//   with. Overlapping windows may add in any order, so results can differ from the CPU's in
//   the last bits. Unlike the CPU kernel it does not raise on an index outside the plane
//   (it skips it): checking would make every backward wait for the GPU; indices come from
//   max_pool2d, which never gives such.
// - The average poolings work on contiguous H*W planes (a CHW input is one image): a
//   channels_last input is copied to NCHW, and an output that is not contiguous is written
//   through a contiguous buffer copied into it.
// - avg_pool2d(+backward) go through cuDNN's average pooling in floor mode: there every
//   window ends inside the padded input, so cuDNN's include-padding divisor (kh * kw) and
//   exclude-padding divisor (the window's input elements) are the CPU's; divisor_override
//   rescales the include-padding mean. ceil_mode (windows past the padding, which cuDNN
//   does not describe) is a kiln::Error for now.
// - adaptive_avg_pool2d(+backward): a 1x1 output is a mean over H and W (eager ops); sizes
//   that divide the input evenly are an average pooling with kernel = stride = in / out;
//   other sizes (overlapping windows of varying size) are a kiln::Error for now.
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/pool.h"
#include "core/ops/reduce.h"
#include "core/registry.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// ---- max pooling: hand-written kernels ----

// One thread per output element. The window walk (and so the winner: NaN wins, the first
// maximum on ties, the first valid element when every value is -inf) is the CPU kernel's;
// the index is the flat one within the H*W plane in both layouts. kPoolWindow ends both
// the NCHW and the NHWC kernel: xp points at element (0, 0) of this output's image and
// channel, AT(h, w) reads element (h, w).
constexpr const char* kPoolWindow = R"(
  int h0 = oh * sh - ph;
  const int h1 = min(h0 + (kh - 1) * dh + 1, in_h);
  while (h0 < 0) h0 += dh;
  int w0 = ow * sw - pw;
  const int w1 = min(w0 + (kw - 1) * dw + 1, in_w);
  while (w0 < 0) w0 += dw;
  C best = (C)__int_as_float(0xff800000);
  long long best_index = (long long)h0 * in_w + w0;
  for (int h = h0; h < h1; h += dh) {
    for (int w = w0; w < w1; w += dw) {
      const C v = AT(h, w);
      if (v > best || v != v) {
        best = v;
        best_index = (long long)h * in_w + w;
      }
    }
  }
  y[i] = best;
  indices[i] = best_index;
}
)";

const KernelFamily kMaxPool("max_pool2d", std::string(R"(
typedef SCALAR C;
#define AT(h, w) xp[(long long)(h) * in_w + (w)]
extern "C" __global__ void NAME(const C* x, C* y, long long* indices, long long total, int channels, int in_h, int in_w,
                                int out_h, int out_w, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int ow = (int)(i % out_w);
  const int oh = (int)((i / out_w) % out_h);
  const long long plane = i / ((long long)out_w * out_h);
  const C* xp = x + plane * in_h * in_w;
)") + kPoolWindow,
                             {DType::f32, DType::f64});

// channels_last: i runs over [N, out_h, out_w, C], x is [N, in_h, in_w, C].
const KernelFamily kMaxPoolNhwc("max_pool2d_nhwc", std::string(R"(
typedef SCALAR C;
#define AT(h, w) xp[((long long)(h) * in_w + (w)) * channels]
extern "C" __global__ void NAME(const C* x, C* y, long long* indices, long long total, int channels, int in_h, int in_w,
                                int out_h, int out_w, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int c = (int)(i % channels);
  const long long pixel = i / channels;
  const int ow = (int)(pixel % out_w);
  const int oh = (int)((pixel / out_w) % out_h);
  const long long image = pixel / ((long long)out_w * out_h);
  const C* xp = x + image * in_h * in_w * channels + c;
)") + kPoolWindow,
                             {DType::f32, DType::f64});

// The backward scatters each grad_out element to its index with an atomic add (the op has
// no window attributes to gather with). NCHW: channels 1 and planes of N*C; NHWC: the
// element's channel is i % channels.
const KernelFamily kMaxPoolBackward("max_pool2d_backward", R"(
typedef SCALAR C;
extern "C" __global__ void NAME(const C* grad, const long long* indices, C* out, long long total, long long channels,
                                long long plane_out, long long plane_in) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const long long j = indices[i];
  if (j < 0 || j >= plane_in) return;
  const long long c = i % channels, image = i / (channels * plane_out);
  atomicAdd(out + (image * plane_in + j) * channels + c, grad[i]);
}
)",
                                       {DType::f32, DType::f64});

int as_int(int64_t v, const char* op) {
  KILN_CHECK(v >= 0 && v <= INT32_MAX, "{}: size {} exceeds the kernel's int range", op, v);
  return static_cast<int>(v);
}

// Whether a 4-d pooling tensor is computed NHWC: channels_last and not also contiguous
// (C == 1 or a 1x1 plane is both; NCHW then).
bool nhwc(const Tensor& t) { return t.dim() == 4 && dnn::is_channels_last(t) && !t.is_contiguous(); }

void max_pool2d_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "max_pool2d";
  const Pool2dParams p = pool2d_params(attrs, op);
  const DType c = compute_dtype(in[0].dtype());
  const bool last = nhwc(in[0]);
  const Tensor x = dnn::in_layout(in[0].to(c), last);
  long long total = out[0].numel();
  if (total == 0) return;
  // The maxima are input elements: computing in f32 and rounding back is exact.
  dnn::into_layout(out[0], last, c, [&](const Tensor& y) {
    dnn::into_layout(out[1], last, DType::i64, [&](const Tensor& idx) {
      const int channels = last ? as_int(x.size(1), op) : 1;
      const int in_h = as_int(x.size(-2), op), in_w = as_int(x.size(-1), op);
      const int out_h = as_int(y.size(-2), op), out_w = as_int(y.size(-1), op);
      (last ? kMaxPoolNhwc : kMaxPool)
          .launch(c, x.device().index, total, x.data_ptr(), y.data_ptr(), idx.data_ptr(), total, channels, in_h, in_w,
                  out_h, out_w, as_int(p.kernel[0], op), as_int(p.kernel[1], op), as_int(p.stride[0], op),
                  as_int(p.stride[1], op), as_int(p.padding[0], op), as_int(p.padding[1], op),
                  as_int(p.dilation[0], op), as_int(p.dilation[1], op));
    });
  });
}

// (grad_out, indices) {input_size} -> grad_input
void max_pool2d_backward_kernel(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(out[0].dtype());
  const bool last = nhwc(out[0]);
  const Tensor grad = dnn::in_layout(in[0].to(c), last), indices = dnn::in_layout(in[1], last);
  Tensor acc = last ? dnn::empty_channels_last(out[0].shape(), c, out[0].device())
                    : empty(out[0].shape(), {.dtype = c, .device = out[0].device()});
  acc.zero_();
  const long long total = grad.numel();
  if (total > 0 && acc.numel() > 0) {
    const long long channels = last ? grad.size(1) : 1;
    const long long plane_out = grad.size(-2) * grad.size(-1), plane_in = acc.size(-2) * acc.size(-1);
    kMaxPoolBackward.launch(c, acc.device().index, total, grad.data_ptr(), indices.data_ptr(), acc.data_ptr(), total,
                            channels, plane_out, plane_in);
  }
  Tensor(out[0]).copy_(acc);
}

// ---- average pooling through cuDNN ----

// A pooling input or output as cuDNN's 4-d [N, C, H, W] (a CHW tensor is one image).
Shape as_nchw(const Shape& s) { return s.size() == 4 ? s : Shape{1, s[0], s[1], s[2]}; }

struct AvgPool {
  int64_t kernel[2], stride[2], padding[2];
  bool count_include_pad = true;
  int64_t divisor = 0;  // divisor_override; 0 when none
};

AvgPool avg_params(const Attrs& attrs, const char* op) {
  const Pool2dParams p = pool2d_params(attrs, op);
  KILN_CHECK(!p.ceil_mode, "{}: ceil_mode is not supported on CUDA yet ({})", op, attrs.to_string());
  return {{p.kernel[0], p.kernel[1]}, {p.stride[0], p.stride[1]}, {p.padding[0], p.padding[1]}, p.count_include_pad,
          p.divisor};
}

void describe(dnn::PoolDesc& desc, const AvgPool& p, const char* op) {
  const cudnnPoolingMode_t mode = p.count_include_pad || p.divisor ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                   : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  dnn::check(cudnnSetPooling2dDescriptor(desc.get(), mode, CUDNN_PROPAGATE_NAN, as_int(p.kernel[0], op),
                                         as_int(p.kernel[1], op), as_int(p.padding[0], op), as_int(p.padding[1], op),
                                         as_int(p.stride[0], op), as_int(p.stride[1], op)),
             op);
}

// divisor_override: the include-padding mean times kh * kw / divisor.
double rescale(const AvgPool& p) {
  return p.divisor ? static_cast<double>(p.kernel[0] * p.kernel[1]) / static_cast<double>(p.divisor) : 1.0;
}

// The descriptors of both directions: x and y contiguous NCHW of the compute dtype c, and
// the window.
struct AvgDescriptors {
  dnn::TensorDesc x, y;
  dnn::PoolDesc pool;
  AvgDescriptors(DType c, const Shape& x_shape, const Shape& y_shape, const AvgPool& p, const char* op) {
    const Shape xs = as_nchw(x_shape), ys = as_nchw(y_shape);
    x.set(c, xs, contiguous_strides(xs), op);
    y.set(c, ys, contiguous_strides(ys), op);
    describe(pool, p, op);
  }
};

// y = avg_pool(x) for contiguous x and y of the compute dtype.
void avg_forward(const Tensor& x, const Tensor& y, const AvgPool& p, const char* op) {
  const DType c = x.dtype();
  const AvgDescriptors d(c, x.shape(), y.shape(), p, op);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const dnn::Scale alpha(rescale(p)), zero(0.0);
  dnn::check(cudnnPoolingForward(dnn::handle_for(device, op), d.pool.get(), alpha.for_type(c), d.x.get(), x.data_ptr(),
                                 zero.for_type(c), d.y.get(), y.data_ptr()),
             op);
}

// dx = avg_pool's gradient for contiguous dy and dx of the compute dtype. Average pooling's
// backward reads neither x nor y, but cuDNN takes them: dy and dx stand in for them.
void avg_backward(const Tensor& dy, const Tensor& dx, const AvgPool& p, const char* op) {
  const DType c = dy.dtype();
  const AvgDescriptors d(c, dx.shape(), dy.shape(), p, op);
  const int device = dy.device().index;
  DeviceGuard guard(device);
  const dnn::Scale alpha(rescale(p)), zero(0.0);
  dnn::check(cudnnPoolingBackward(dnn::handle_for(device, op), d.pool.get(), alpha.for_type(c), d.y.get(), dy.data_ptr(),
                                  d.y.get(), dy.data_ptr(), d.x.get(), dx.data_ptr(), zero.for_type(c), d.x.get(),
                                  dx.data_ptr()),
             op);
}

// Runs f(buffer) into `out` through a contiguous buffer of dtype c (out itself when it is one).
template <class F>
void through(const Tensor& out, DType c, F&& f) {
  if (out.dtype() == c && out.is_contiguous()) return f(out);
  const Tensor buf = empty(out.shape(), {.dtype = c, .device = out.device()});
  f(buf);
  Tensor(out).copy_(buf);
}

void avg_pool2d_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "avg_pool2d";
  const AvgPool p = avg_params(attrs, op);
  if (out[0].numel() == 0) return;
  const DType c = compute_dtype(in[0].dtype());
  const Tensor x = in[0].to(c).contiguous();
  through(out[0], c, [&](const Tensor& y) { avg_forward(x, y, p, op); });
}

void avg_pool2d_backward_kernel(Span in, Span out, const Attrs& attrs) {
  constexpr const char* op = "avg_pool2d_backward";
  const AvgPool p = avg_params(attrs, op);
  if (out[0].numel() == 0) return;
  const DType c = compute_dtype(out[0].dtype());
  const Tensor dy = in[0].to(c).contiguous();
  through(out[0], c, [&](const Tensor& dx) { avg_backward(dy, dx, p, op); });
}

// ---- adaptive average pooling ----

// The average pooling an adaptive one is when the output sizes divide the input sizes.
AvgPool adaptive_as_avg(const Shape& input, const Shape& output, const char* op) {
  const int64_t in_h = input[input.size() - 2], in_w = input.back();
  const int64_t out_h = output[output.size() - 2], out_w = output.back();
  KILN_CHECK(in_h % out_h == 0 && in_w % out_w == 0,
             "{}: on CUDA the output size {}x{} must be 1x1 or divide the input size {}x{} (other sizes are "
             "not supported yet)",
             op, out_h, out_w, in_h, in_w);
  const int64_t kh = in_h / out_h, kw = in_w / out_w;
  return {{kh, kw}, {kh, kw}, {0, 0}, true, 0};
}

bool is_global(const Shape& pooled) { return pooled[pooled.size() - 2] == 1 && pooled.back() == 1; }

void adaptive_avg_pool2d_kernel(Span in, Span out, const Attrs&) {
  constexpr const char* op = "adaptive_avg_pool2d";
  if (out[0].numel() == 0) return;
  NoGradGuard no_grad;
  const DType c = compute_dtype(in[0].dtype());
  if (is_global(out[0].shape())) {
    Tensor(out[0]).copy_(mean(in[0].to(c), {-2, -1}, true));
    return;
  }
  const AvgPool p = adaptive_as_avg(in[0].shape(), out[0].shape(), op);
  const Tensor x = in[0].to(c).contiguous();
  through(out[0], c, [&](const Tensor& y) { avg_forward(x, y, p, op); });
}

void adaptive_avg_pool2d_backward_kernel(Span in, Span out, const Attrs&) {
  constexpr const char* op = "adaptive_avg_pool2d_backward";
  if (out[0].numel() == 0) return;
  NoGradGuard no_grad;
  const DType c = compute_dtype(out[0].dtype());
  if (is_global(in[0].shape())) {
    const double plane = static_cast<double>(out[0].size(-2) * out[0].size(-1));
    Tensor(out[0]).copy_(div(in[0].to(c), plane));  // broadcast over H and W
    return;
  }
  const AvgPool p = adaptive_as_avg(out[0].shape(), in[0].shape(), op);
  const Tensor dy = in[0].to(c).contiguous();
  through(out[0], c, [&](const Tensor& dx) { avg_backward(dy, dx, p, op); });
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("max_pool2d", cuda, max_pool2d_kernel);
    register_kernel("max_pool2d_backward", cuda, max_pool2d_backward_kernel);
    register_kernel("avg_pool2d", cuda, avg_pool2d_kernel);
    register_kernel("avg_pool2d_backward", cuda, avg_pool2d_backward_kernel);
    register_kernel("adaptive_avg_pool2d", cuda, adaptive_avg_pool2d_kernel);
    register_kernel("adaptive_avg_pool2d_backward", cuda, adaptive_avg_pool2d_backward_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
