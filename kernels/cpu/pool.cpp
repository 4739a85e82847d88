// CPU kernels of the pooling ops. Every op works on contiguous H*W planes, one plane per
// (n, c), and the planes are split among threads. Backward ops accumulate in the compute
// type (f32 for the 16-bit floats) and cast once at the end.
#include "core/ops/pool.h"

#include <algorithm>
#include <atomic>
#include <limits>

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

struct Planes {
  int64_t count;  // N * C
  int64_t in_h, in_w, out_h, out_w;
};

// `in` is the op's input (or grad_input) side, `out` its pooled side.
Planes planes_of(const Tensor& in, const Tensor& out) {
  const int64_t nd = in.dim();
  return {in.numel() / (in.size(nd - 2) * in.size(nd - 1)), in.size(nd - 2), in.size(nd - 1),
          out.size(nd - 2), out.size(nd - 1)};
}

// Runs body(begin, end) over plane ranges, enough planes per thread to pay for it.
template <class Body>
void for_planes(int64_t count, int64_t work_per_plane, Body&& body) {
  parallel_for(count, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work_per_plane)), body);
}

void max_pool2d(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "max_pool2d");
  const Tensor x = in[0].contiguous();
  const Planes g = planes_of(x, out[0]);
  visit_floating(x.dtype(), "max_pool2d", [&]<class T>() {
    using C = compute_t<T>;
    const T* xs = x.data_ptr<T>();
    T* ys = out[0].data_ptr<T>();
    int64_t* is = out[1].data_ptr<int64_t>();
    const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
    const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
    for_planes(g.count, g.out_h * g.out_w * kh * kw, [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        const T* xp = xs + plane * g.in_h * g.in_w;
        T* yp = ys + plane * g.out_h * g.out_w;
        int64_t* ip = is + plane * g.out_h * g.out_w;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          int64_t h0 = oh * sh - ph;
          const int64_t h1 = std::min(h0 + (kh - 1) * dh + 1, g.in_h);
          while (h0 < 0) h0 += dh;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            int64_t w0 = ow * sw - pw;
            const int64_t w1 = std::min(w0 + (kw - 1) * dw + 1, g.in_w);
            while (w0 < 0) w0 += dw;
            // As PyTorch: the first valid element when every value is -inf, and NaN wins.
            C best = -std::numeric_limits<C>::infinity();
            int64_t best_index = h0 * g.in_w + w0;
            for (int64_t h = h0; h < h1; h += dh) {
              for (int64_t w = w0; w < w1; w += dw) {
                const C v = static_cast<C>(xp[h * g.in_w + w]);
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
  });
}

void max_pool2d_backward(Span in, Span out, const Attrs&) {
  const DType c = accumulate_dtype(out[0].dtype());
  const Tensor grad = as_dtype(in[0], c).contiguous();
  const Tensor indices = in[1].contiguous();
  std::atomic<bool> out_of_range{false};
  into(out[0], c, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      const int64_t* is = indices.data_ptr<int64_t>();
      C* os = gi.data_ptr<C>();
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

void avg_pool2d(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "avg_pool2d");
  const Tensor x = in[0].contiguous();
  const Planes g = planes_of(x, out[0]);
  visit_floating(x.dtype(), "avg_pool2d", [&]<class T>() {
    using C = compute_t<T>;
    const T* xs = x.data_ptr<T>();
    T* ys = out[0].data_ptr<T>();
    for_planes(g.count, g.out_h * g.out_w * p.kernel[0] * p.kernel[1], [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        const T* xp = xs + plane * g.in_h * g.in_w;
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
  });
}

void avg_pool2d_backward(Span in, Span out, const Attrs& attrs) {
  const Pool2dParams p = pool2d_params(attrs, "avg_pool2d_backward");
  const DType c = accumulate_dtype(out[0].dtype());
  const Tensor grad = as_dtype(in[0], c).contiguous();
  into(out[0], c, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      C* os = gi.data_ptr<C>();
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

void adaptive_avg_pool2d(Span in, Span out, const Attrs&) {
  const Tensor x = in[0].contiguous();
  const Planes g = planes_of(x, out[0]);
  visit_floating(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    using C = compute_t<T>;
    const T* xs = x.data_ptr<T>();
    T* ys = out[0].data_ptr<T>();
    // Each input element lies in about one window per dim (more when the output is larger).
    const int64_t work = g.in_h * g.in_w + g.out_h * g.out_w;
    for_planes(g.count, work, [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        const T* xp = xs + plane * g.in_h * g.in_w;
        T* yp = ys + plane * g.out_h * g.out_w;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t h0 = adaptive_start(oh, g.in_h, g.out_h);
          const int64_t h1 = adaptive_end(oh, g.in_h, g.out_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
            const int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
            C sum = 0;
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) sum += static_cast<C>(xp[h * g.in_w + w]);
            yp[oh * g.out_w + ow] = static_cast<T>(sum / static_cast<C>((h1 - h0) * (w1 - w0)));
          }
        }
      }
    });
  });
}

void adaptive_avg_pool2d_backward(Span in, Span out, const Attrs&) {
  const DType c = accumulate_dtype(out[0].dtype());
  const Tensor grad = as_dtype(in[0], c).contiguous();
  into(out[0], c, [&](const Tensor& gi) {
    const Planes g = planes_of(gi, grad);
    visit_accumulate(c, [&]<class C>() {
      const C* gs = grad.data_ptr<C>();
      C* os = gi.data_ptr<C>();
      const int64_t plane_in = g.in_h * g.in_w, plane_out = g.out_h * g.out_w;
      for_planes(g.count, plane_in + plane_out, [&](int64_t b, int64_t e) {
        std::fill(os + b * plane_in, os + e * plane_in, C(0));
        for (int64_t plane = b; plane < e; ++plane) {
          C* op = os + plane * plane_in;
          const C* gp = gs + plane * plane_out;
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            const int64_t h0 = adaptive_start(oh, g.in_h, g.out_h);
            const int64_t h1 = adaptive_end(oh, g.in_h, g.out_h);
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              const int64_t w0 = adaptive_start(ow, g.in_w, g.out_w);
              const int64_t w1 = adaptive_end(ow, g.in_w, g.out_w);
              const C share = gp[oh * g.out_w + ow] / static_cast<C>((h1 - h0) * (w1 - w0));
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t w = w0; w < w1; ++w) op[h * g.in_w + w] += share;
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
