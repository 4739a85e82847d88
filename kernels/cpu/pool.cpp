// CPU kernels of the pooling ops. Every op works on contiguous H*W planes, one plane per
// (n, c), and the planes are split among threads; a channels_last tensor stays NHWC and is
// worked on as rows of C channels (C innermost, so the inner loops run over contiguous
// channels), the output positions (forward) or images and channel blocks (backward, which
// scatters) split among threads. Both layouts visit each window in the same order, so they
// give the same values, and max pooling's indices are the flat h * W + w in the input plane
// either way. Backward ops accumulate in the compute type (f32 for the 16-bit floats) and
// cast once at the end.
#include "core/ops/pool.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/registry.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// The type a backward op accumulates in, and a call of f<C>() with it.
DType accumulate_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }
template <class F>
void visit_accumulate(DType c, F&& f) {
  if (c == DType::f64)
    f.template operator()<double>();
  else
    f.template operator()<float>();
}

// The layout a backward op's grad_input has by its shape rule: channels_last when grad_out
// is or the `channels_last` attribute asks for it.
MemoryFormat backward_format(const Tensor& grad, const Attrs& attrs) {
  return attrs.has("channels_last") && attrs.b("channels_last") ? MemoryFormat::channels_last
                                                                : grad.suggest_memory_format();
}

struct Planes {
  int64_t count;  // N * C
  int64_t channels;
  int64_t in_h, in_w, out_h, out_w;
  int64_t images() const { return channels ? count / channels : 0; }
};

// `in` is the op's input (or grad_input) side, `out` its pooled side.
Planes planes_of(const Tensor& in, const Tensor& out) {
  const int64_t nd = in.dim();
  return {in.numel() / (in.size(nd - 2) * in.size(nd - 1)),
          in.size(nd - 3),
          in.size(nd - 2),
          in.size(nd - 1),
          out.size(nd - 2),
          out.size(nd - 1)};
}

// The channels a backward task of the NHWC paths owns: tasks are (image, channel block)
// pairs, so no two threads scatter into the same element.
constexpr int64_t kChannelBlock = 256;
struct ChannelTask {
  int64_t n, c0, c1;
};
ChannelTask channel_task(const Planes& g, int64_t task) {
  const int64_t blocks = (g.channels + kChannelBlock - 1) / kChannelBlock;
  const int64_t c0 = (task % blocks) * kChannelBlock;
  return {task / blocks, c0, std::min(g.channels, c0 + kChannelBlock)};
}
int64_t channel_tasks(const Planes& g) {
  return g.images() * ((g.channels + kChannelBlock - 1) / kChannelBlock);
}

// Zeroes channels [c0, c1) of image n of an NHWC grad_input.
template <class C>
void zero_channels(C* os, const Planes& g, const ChannelTask& t) {
  const int64_t plane_in = g.in_h * g.in_w;
  for (int64_t r = 0; r < plane_in; ++r) {
    C* row = os + (t.n * plane_in + r) * g.channels;
    std::fill(row + t.c0, row + t.c1, C(0));
  }
}

// Runs body(begin, end) over plane ranges, enough planes per thread to pay for it.
template <class Body>
void for_planes(int64_t count, int64_t work_per_plane, Body&& body) {
  parallel_for(count, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work_per_plane)), body);
}

// max_pool2d's window of output (oh, ow): rows [h0, h1) and cols [w0, w1), walked with
// the dilation as step, starting at the first tap inside the input.
struct MaxWindow {
  int64_t h0, h1, w0, w1;
};
MaxWindow max_window(const Pool2dParams& p, const Planes& g, int64_t oh, int64_t ow) {
  const int64_t dh = p.dilation[0], dw = p.dilation[1];
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  const int64_t h1 = std::min(h0 + (p.kernel[0] - 1) * dh + 1, g.in_h);
  const int64_t w1 = std::min(w0 + (p.kernel[1] - 1) * dw + 1, g.in_w);
  while (h0 < 0) h0 += dh;
  while (w0 < 0) w0 += dw;
  return {h0, h1, w0, w1};
}

// An input plane in the compute type. 16-bit planes are widened first, into a buffer kept
// across planes: g++ turns the pooling loops' selects into branches when each load converts,
// which mispredict on random data (bf16 max pooling ran 5x slower than f32). f32 and f64
// planes are read where they are.
template <class T>
class WidePlane {
 public:
  using C = compute_t<T>;
  explicit WidePlane(int64_t size) : wide_(std::is_same_v<T, C> ? 0 : static_cast<size_t>(size)) {}
  const C* of(const T* src) {
    if constexpr (std::is_same_v<T, C>) {
      return src;
    } else {
      for (size_t i = 0; i < wide_.size(); ++i) wide_[i] = static_cast<C>(src[i]);
      return wide_.data();
    }
  }

 private:
  std::vector<C> wide_;
};

template <class T>
void max_pool2d_nchw(const Tensor& x, const Tensor& y, const Tensor& indices,
                     const Pool2dParams& p) {
  using C = compute_t<T>;
  const Planes g = planes_of(x, y);
  const T* xs = x.data_ptr<T>();
  T* ys = y.data_ptr<T>();
  int64_t* is = indices.data_ptr<int64_t>();
  const int64_t dh = p.dilation[0], dw = p.dilation[1];
  for_planes(g.count, g.out_h * g.out_w * p.kernel[0] * p.kernel[1], [&](int64_t b, int64_t e) {
    WidePlane<T> wide(g.in_h * g.in_w);
    for (int64_t plane = b; plane < e; ++plane) {
      const C* xp = wide.of(xs + plane * g.in_h * g.in_w);
      T* yp = ys + plane * g.out_h * g.out_w;
      int64_t* ip = is + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const auto [h0, h1, w0, w1] = max_window(p, g, oh, ow);
          // As PyTorch: the first valid element when every value is -inf, and NaN wins.
          C best = -std::numeric_limits<C>::infinity();
          int64_t best_index = h0 * g.in_w + w0;
          for (int64_t h = h0; h < h1; h += dh) {
            for (int64_t w = w0; w < w1; w += dw) {
              const C v = xp[h * g.in_w + w];
              // Selects rather than branches: which element wins is data-dependent.
              const bool take = v > best || scalar::is_nan(v);
              best = take ? v : best;
              best_index = take ? h * g.in_w + w : best_index;
            }
          }
          yp[oh * g.out_w + ow] = static_cast<T>(best);
          ip[oh * g.out_w + ow] = best_index;
        }
      }
    }
  });
}

// One window element's update of an output position's running maxima over its channels: as
// in the NCHW loop, a larger value or a NaN takes the place.
template <class T, class C, class I>
void take_max(const T* __restrict xp, C* __restrict best, I* __restrict index, I flat,
              int64_t channels) {
  for (int64_t c = 0; c < channels; ++c) {
    const C v = static_cast<C>(xp[c]);
    const bool take = v > best[c] || scalar::is_nan(v);
    best[c] = take ? v : best[c];
    index[c] = take ? flat : index[c];
  }
}

// max_pool2d over NHWC x, y and indices: each output position's window is walked as in the
// NCHW loop, with vectors of running maxima and indices over the channels. The indices are
// kept as I (of C's width where they fit, so that take_max vectorizes) and widened at the end.
template <class T, class I>
void max_pool2d_nhwc(const Tensor& x, const Tensor& y, const Tensor& indices,
                     const Pool2dParams& p) {
  using C = compute_t<T>;
  const Planes g = planes_of(x, y);
  const int64_t channels = g.channels, positions = g.out_h * g.out_w;
  const T* xs = x.data_ptr<T>();
  T* ys = y.data_ptr<T>();
  int64_t* is = indices.data_ptr<int64_t>();
  const int64_t dh = p.dilation[0], dw = p.dilation[1];
  for_planes(g.images() * positions, channels * p.kernel[0] * p.kernel[1], [&](int64_t b, int64_t e) {
    std::vector<C> best_values(static_cast<size_t>(channels));
    std::vector<I> best_indices(static_cast<size_t>(channels));
    C* best = best_values.data();
    I* best_index = best_indices.data();
    for (int64_t pos = b; pos < e; ++pos) {
      const int64_t n = pos / positions, oh = pos % positions / g.out_w, ow = pos % g.out_w;
      const auto [h0, h1, w0, w1] = max_window(p, g, oh, ow);
      std::fill(best, best + channels, -std::numeric_limits<C>::infinity());
      std::fill(best_index, best_index + channels, static_cast<I>(h0 * g.in_w + w0));
      for (int64_t h = h0; h < h1; h += dh) {
        for (int64_t w = w0; w < w1; w += dw) {
          const T* xp = xs + ((n * g.in_h + h) * g.in_w + w) * channels;
          take_max(xp, best, best_index, static_cast<I>(h * g.in_w + w), channels);
        }
      }
      T* yp = ys + pos * channels;
      int64_t* ip = is + pos * channels;
      for (int64_t c = 0; c < channels; ++c) {
        yp[c] = static_cast<T>(best[c]);
        ip[c] = best_index[c];
      }
    }
  });
}

void max_pool2d(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "max_pool2d");
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  visit_floating(x.dtype(), "max_pool2d", [&]<class T>() {
    into_layout(out[0], x.dtype(), format, [&](const Tensor& y) {
      into_layout(out[1], DType::i64, format, [&](const Tensor& indices) {
        using Narrow = std::conditional_t<sizeof(compute_t<T>) == 4, int32_t, int64_t>;
        const bool narrow_fits = x.size(-2) * x.size(-1) <= std::numeric_limits<int32_t>::max();
        if (format == MemoryFormat::channels_last && narrow_fits)
          max_pool2d_nhwc<T, Narrow>(x, y, indices, p);
        else if (format == MemoryFormat::channels_last)
          max_pool2d_nhwc<T, int64_t>(x, y, indices, p);
        else
          max_pool2d_nchw<T>(x, y, indices, p);
      });
    });
  });
}

// Adds one output position's gradients gp[c] to the input pixels ip[c] of image plane op
// (NHWC, `channels` wide), for c in [c0, c1). Returns false when an index lies outside the
// plane of `plane_in` pixels (that one is skipped).
template <class C>
bool scatter_position(const C* __restrict gp, const int64_t* __restrict ip, C* __restrict op,
                      int64_t c0, int64_t c1, int64_t channels, int64_t plane_in) {
  bool in_range = true;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t i = ip[c];
    const bool ok = i >= 0 && i < plane_in;
    in_range = in_range && ok;
    if (ok) op[i * channels + c] += gp[c];
  }
  return in_range;
}

// max_pool2d_backward over NHWC grad, indices and grad_input: tasks own an image's block of
// channels, so the scatter needs no atomics.
template <class C>
void max_pool2d_backward_nhwc(const C* gs, const int64_t* is, C* os, const Planes& g,
                              std::atomic<bool>& out_of_range) {
  const int64_t channels = g.channels, plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
  for_planes(channel_tasks(g), (plane_in + plane_out) * kChannelBlock, [&](int64_t b, int64_t e) {
    bool in_range = true;
    for (int64_t task = b; task < e; ++task) {
      const ChannelTask t = channel_task(g, task);
      zero_channels(os, g, t);
      C* op = os + t.n * plane_in * channels;
      for (int64_t o = 0; o < plane_out; ++o) {
        const int64_t row = (t.n * plane_out + o) * channels;
        in_range &= scatter_position(gs + row, is + row, op, t.c0, t.c1, channels, plane_in);
      }
    }
    if (!in_range) out_of_range = true;
  });
}

void max_pool2d_backward(Span in, Span out, const Attrs& attrs) {
  const DType c = accumulate_dtype(out[0].dtype());
  const MemoryFormat format = backward_format(in[0], attrs);
  const Tensor grad = as_dtype(in[0], c).contiguous(format);
  const Tensor indices = in[1].contiguous(format);
  std::atomic<bool> out_of_range{false};
  into_layout(out[0], c, format, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      const int64_t* is = indices.data_ptr<int64_t>();
      C* os = gi.data_ptr<C>();
      if (format == MemoryFormat::channels_last)
        return max_pool2d_backward_nhwc(gs, is, os, g, out_of_range);
      const int64_t plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
      for_planes(g.count, plane_in + plane_out, [&](int64_t b, int64_t e) {
        std::fill(os + b * plane_in, os + e * plane_in, C(0));
        for (int64_t plane = b; plane < e; ++plane) {
          C* op = os + plane * plane_in;
          const C* gp = gs + plane * plane_out;
          const int64_t* ip = is + plane * plane_out;
          for (int64_t o = 0; o < plane_out; ++o) {
            const int64_t i = ip[o];
            if (i < 0 || i >= plane_in) {
              out_of_range = true;
              continue;
            }
            op[i] += gp[o];
          }
        }
      });
    });
  });
  KILN_CHECK(!out_of_range, "max_pool2d_backward: an index lies outside the {}x{} input plane",
             out[0].size(-2), out[0].size(-1));
}

// avg_pool2d's window of output (oh, ow): the clipped rows and cols and the divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  int64_t divisor;
};

AvgWindow avg_window(const Pool2dParams& p, const Planes& g, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel[0], g.in_h + p.padding[0]);
  int64_t w1 = std::min(w0 + p.kernel[1], g.in_w + p.padding[1]);
  const int64_t padded_size = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, g.in_h);
  w1 = std::min(w1, g.in_w);
  const int64_t divisor = p.divisor             ? p.divisor
                          : p.count_include_pad ? padded_size
                                                : (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, divisor};
}

// adaptive_avg_pool2d's window of output (oh, ow), divided by its size.
AvgWindow adaptive_window(const Planes& g, int64_t oh, int64_t ow) {
  const int64_t h0 = adaptive_start(oh, g.in_h, g.out_h), h1 = adaptive_end(oh, g.in_h, g.out_h);
  const int64_t w0 = adaptive_start(ow, g.in_w, g.out_w), w1 = adaptive_end(ow, g.in_w, g.out_w);
  return {h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
}

// Average pooling over NHWC x and y, window_of(oh, ow) giving each output's AvgWindow; the
// windows are summed in the NCHW loops' order, one vector of channel sums per position.
template <class T, class WindowOf>
void avg_pool_nhwc(const Tensor& x, const Tensor& y, int64_t window_size, WindowOf window_of) {
  using C = compute_t<T>;
  const Planes g = planes_of(x, y);
  const int64_t channels = g.channels, positions = g.out_h * g.out_w;
  const T* xs = x.data_ptr<T>();
  T* ys = y.data_ptr<T>();
  for_planes(g.images() * positions, channels * window_size, [&](int64_t b, int64_t e) {
    std::vector<C> sum_values(static_cast<size_t>(channels));
    C* sum = sum_values.data();
    for (int64_t pos = b; pos < e; ++pos) {
      const int64_t n = pos / positions, oh = pos % positions / g.out_w, ow = pos % g.out_w;
      const AvgWindow win = window_of(g, oh, ow);
      T* yp = ys + pos * channels;
      // A window wholly in the padding (possible in ceil mode) averages nothing.
      if (win.h0 >= win.h1 || win.w0 >= win.w1) {
        std::fill(yp, yp + channels, T(0));
        continue;
      }
      std::fill(sum, sum + channels, C(0));
      for (int64_t h = win.h0; h < win.h1; ++h) {
        for (int64_t w = win.w0; w < win.w1; ++w) {
          const T* xp = xs + ((n * g.in_h + h) * g.in_w + w) * channels;
          for (int64_t c = 0; c < channels; ++c) sum[c] += static_cast<C>(xp[c]);
        }
      }
      const C divisor = static_cast<C>(win.divisor);
      for (int64_t c = 0; c < channels; ++c) yp[c] = static_cast<T>(sum[c] / divisor);
    }
  });
}

// Average pooling's gradient over NHWC grad and grad_input: tasks own an image's block of
// channels, and each output's share is added over its window in the NCHW loops' order.
template <class C, class WindowOf>
void avg_pool_backward_nhwc(const C* gs, C* os, const Planes& g, int64_t window_size,
                            WindowOf window_of) {
  const int64_t channels = g.channels, plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
  for_planes(channel_tasks(g), (plane_in + plane_out * window_size) * kChannelBlock,
             [&](int64_t b, int64_t e) {
               C share[kChannelBlock];
               for (int64_t task = b; task < e; ++task) {
                 const ChannelTask t = channel_task(g, task);
                 const int64_t width = t.c1 - t.c0;
                 zero_channels(os, g, t);
                 for (int64_t oh = 0; oh < g.out_h; ++oh) {
                   for (int64_t ow = 0; ow < g.out_w; ++ow) {
                     const AvgWindow win = window_of(g, oh, ow);
                     const C* gp = gs + ((t.n * g.out_h + oh) * g.out_w + ow) * channels + t.c0;
                     const C divisor = static_cast<C>(win.divisor);
                     for (int64_t c = 0; c < width; ++c) share[c] = gp[c] / divisor;
                     for (int64_t h = win.h0; h < win.h1; ++h) {
                       for (int64_t w = win.w0; w < win.w1; ++w) {
                         C* op = os + ((t.n * g.in_h + h) * g.in_w + w) * channels + t.c0;
                         for (int64_t c = 0; c < width; ++c) op[c] += share[c];
                       }
                     }
                   }
                 }
               }
             });
}

template <class T>
void avg_pool2d_nchw(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  using C = compute_t<T>;
  const Planes g = planes_of(x, y);
  const T* xs = x.data_ptr<T>();
  T* ys = y.data_ptr<T>();
  for_planes(g.count, g.out_h * g.out_w * p.kernel[0] * p.kernel[1], [&](int64_t b, int64_t e) {
    WidePlane<T> wide(g.in_h * g.in_w);
    for (int64_t plane = b; plane < e; ++plane) {
      const C* xp = wide.of(xs + plane * g.in_h * g.in_w);
      T* yp = ys + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow win = avg_window(p, g, oh, ow);
          // A window wholly in the padding (possible in ceil mode) averages nothing.
          if (win.h0 >= win.h1 || win.w0 >= win.w1) {
            yp[oh * g.out_w + ow] = T(0);
            continue;
          }
          C sum = 0;
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) sum += static_cast<C>(xp[h * g.in_w + w]);
          yp[oh * g.out_w + ow] = static_cast<T>(sum / static_cast<C>(win.divisor));
        }
      }
    }
  });
}

void avg_pool2d(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "avg_pool2d");
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  visit_floating(x.dtype(), "avg_pool2d", [&]<class T>() {
    into_layout(out[0], x.dtype(), format, [&](const Tensor& y) {
      if (format == MemoryFormat::channels_last) {
        avg_pool_nhwc<T>(
            x, y, p.kernel[0] * p.kernel[1],
            [&p](const Planes& g, int64_t oh, int64_t ow) { return avg_window(p, g, oh, ow); });
      } else {
        avg_pool2d_nchw<T>(x, y, p);
      }
    });
  });
}

void avg_pool2d_backward(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "avg_pool2d_backward");
  const DType c = accumulate_dtype(out[0].dtype());
  const MemoryFormat format = backward_format(in[0], attrs);
  const Tensor grad = as_dtype(in[0], c).contiguous(format);
  into_layout(out[0], c, format, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      C* os = gi.data_ptr<C>();
      if (format == MemoryFormat::channels_last) {
        return avg_pool_backward_nhwc(gs, os, g, p.kernel[0] * p.kernel[1],
                                      [&p](const Planes& planes, int64_t oh, int64_t ow) {
                                        return avg_window(p, planes, oh, ow);
                                      });
      }
      const int64_t plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
      for_planes(g.count, plane_in + plane_out * p.kernel[0] * p.kernel[1],
                 [&](int64_t b, int64_t e) {
                   std::fill(os + b * plane_in, os + e * plane_in, C(0));
                   for (int64_t plane = b; plane < e; ++plane) {
                     C* op = os + plane * plane_in;
                     const C* gp = gs + plane * plane_out;
                     for (int64_t oh = 0; oh < g.out_h; ++oh) {
                       for (int64_t ow = 0; ow < g.out_w; ++ow) {
                         const AvgWindow win = avg_window(p, g, oh, ow);
                         const C share = gp[oh * g.out_w + ow] / static_cast<C>(win.divisor);
                         for (int64_t h = win.h0; h < win.h1; ++h)
                           for (int64_t w = win.w0; w < win.w1; ++w) op[h * g.in_w + w] += share;
                       }
                     }
                   }
                 });
    });
  });
}

template <class T>
void adaptive_avg_pool2d_nchw(const Tensor& x, const Tensor& y) {
  using C = compute_t<T>;
  const Planes g = planes_of(x, y);
  const T* xs = x.data_ptr<T>();
  T* ys = y.data_ptr<T>();
  // Each input element lies in about one window per dim (more when the output is larger).
  const int64_t work = g.in_h * g.in_w + g.out_h * g.out_w;
  for_planes(g.count, work, [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const T* xp = xs + plane * g.in_h * g.in_w;
      T* yp = ys + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow win = adaptive_window(g, oh, ow);
          C sum = 0;
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) sum += static_cast<C>(xp[h * g.in_w + w]);
          yp[oh * g.out_w + ow] = static_cast<T>(sum / static_cast<C>(win.divisor));
        }
      }
    }
  });
}

// The average window size of an adaptive pooling, for the work estimate.
int64_t adaptive_window_size(const Planes& g) {
  const int64_t out = std::max<int64_t>(1, g.out_h * g.out_w);
  return std::max<int64_t>(1, g.in_h * g.in_w / out);
}

void adaptive_avg_pool2d(Span in, Span out, const Attrs&) {
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  visit_floating(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    into_layout(out[0], x.dtype(), format, [&](const Tensor& y) {
      if (format == MemoryFormat::channels_last)
        avg_pool_nhwc<T>(x, y, adaptive_window_size(planes_of(x, y)), adaptive_window);
      else
        adaptive_avg_pool2d_nchw<T>(x, y);
    });
  });
}

void adaptive_avg_pool2d_backward(Span in, Span out, const Attrs& attrs) {
  const DType c = accumulate_dtype(out[0].dtype());
  const MemoryFormat format = backward_format(in[0], attrs);
  const Tensor grad = as_dtype(in[0], c).contiguous(format);
  into_layout(out[0], c, format, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      C* os = gi.data_ptr<C>();
      if (format == MemoryFormat::channels_last)
        return avg_pool_backward_nhwc(gs, os, g, adaptive_window_size(g), adaptive_window);
      const int64_t plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
      for_planes(g.count, plane_in + plane_out, [&](int64_t b, int64_t e) {
        std::fill(os + b * plane_in, os + e * plane_in, C(0));
        for (int64_t plane = b; plane < e; ++plane) {
          C* op = os + plane * plane_in;
          const C* gp = gs + plane * plane_out;
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              const AvgWindow win = adaptive_window(g, oh, ow);
              const C share = gp[oh * g.out_w + ow] / static_cast<C>(win.divisor);
              for (int64_t h = win.h0; h < win.h1; ++h)
                for (int64_t w = win.w0; w < win.w1; ++w) op[h * g.in_w + w] += share;
            }
          }
        }
      });
    });
  });
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("max_pool2d", cpu, max_pool2d);
    register_kernel("max_pool2d_backward", cpu, max_pool2d_backward);
    register_kernel("avg_pool2d", cpu, avg_pool2d);
    register_kernel("avg_pool2d_backward", cpu, avg_pool2d_backward);
    register_kernel("adaptive_avg_pool2d", cpu, adaptive_avg_pool2d);
    register_kernel("adaptive_avg_pool2d_backward", cpu, adaptive_avg_pool2d_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
