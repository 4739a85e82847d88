// CPU kernels of batch and layer normalization. Inputs are made contiguous and seen as
// [N, C, L] (batch norm: threads split the channels) or [M, K] (layer norm: threads split
// the rows), so every inner loop runs over contiguous memory. A channels_last batch-norm
// input stays NHWC and is seen as [N*H*W, C]: rows of C channels, which threads split, with
// per-channel vectors in the inner loops. Sums accumulate in f64; elementwise work happens
// in the compute type (f32 for the 16-bit floats).
#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/registry.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

template <class T>
[[gnu::always_inline]] inline double to_double(T v) {
  return static_cast<double>(static_cast<compute_t<T>>(v));
}

// Sum of term(i) over [0, n) in f64, in eight independent lanes so the loop vectorizes.
template <class Term>
[[gnu::always_inline]] inline double accumulate(int64_t n, Term term) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += term(i + j);
  double sum = 0;
  for (; i < n; ++i) sum += term(i);
  for (double v : lane) sum += v;
  return sum;
}

// A small (per-channel or per-feature) tensor read as f64; `fallback` for every element
// when it is absent.
std::vector<double> read_values(const Tensor& t, int64_t n, double fallback) {
  if (!t.defined() || t.numel() == 0) return std::vector<double>(static_cast<size_t>(n), fallback);
  const Tensor c = as_dtype(t, DType::f64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + n);
}

// Writes `v` into `t` (any floating dtype, any strides, one dim).
void write_values(const Tensor& t, const std::vector<double>& v) {
  visit_floating(t.dtype(), "norm", [&]<class R>() {
    R* p = static_cast<R*>(t.data_ptr());
    const int64_t stride = t.dim() ? t.stride(0) : 1;
    for (size_t i = 0; i < v.size(); ++i)
      p[static_cast<int64_t>(i) * stride] = static_cast<R>(static_cast<compute_t<R>>(v[i]));
  });
}

// `t` contiguous in the compute type of an input of dtype `input` (f32 for the 16-bit
// floats), converted when needed.
Tensor in_compute_dtype(const Tensor& t, DType input) {
  return as_dtype(t, input == DType::f64 ? DType::f64 : DType::f32).contiguous();
}

struct ChannelLayout {
  int64_t n, c, l;  // input viewed as [N, C, L]; channels_last: [N * L, C]
  bool channels_last = false;
  int64_t rows() const { return n * l; }
};
// x must be contiguous in `format`.
ChannelLayout channel_layout(const Tensor& x, MemoryFormat format) {
  int64_t l = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l *= x.size(d);
  return {x.size(0), x.size(1), l, format == MemoryFormat::channels_last};
}

int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work_per_item));
}

// Per-channel f64 sums over the rows of an NHWC tensor seen as [rows, C]: add_rows(r0, r1,
// acc) adds the terms of rows [r0, r1) into acc[k * C + c] for each of the `sums` sums. The
// rows are cut into blocks whose size depends only on the shape; each block sums into its
// own partials, and the partials are added in block order, so the result depends neither on
// the thread count nor on scheduling.
template <class AddRows>
std::vector<double> row_block_sums(int64_t rows, int64_t channels, int64_t sums, AddRows add_rows) {
  constexpr int64_t kBlockElements = 8192, kMaxBlocks = 256;
  const int64_t width = sums * channels;
  std::vector<double> total(static_cast<size_t>(width), 0.0);
  if (rows == 0 || channels == 0) return total;
  const int64_t block_rows =
      std::max({int64_t{1}, kBlockElements / channels, (rows + kMaxBlocks - 1) / kMaxBlocks});
  const int64_t blocks = (rows + block_rows - 1) / block_rows;
  std::vector<double> partials(static_cast<size_t>(blocks * width), 0.0);
  parallel_for(blocks, grain_for(block_rows * channels), [&](int64_t b, int64_t e) {
    for (int64_t block = b; block < e; ++block) {
      add_rows(block * block_rows, std::min(rows, (block + 1) * block_rows),
               partials.data() + block * width);
    }
  });
  for (int64_t block = 0; block < blocks; ++block) {
    const double* acc = partials.data() + block * width;
    for (int64_t i = 0; i < width; ++i) total[i] += acc[i];
  }
  return total;
}

// acc[c] += term(r, c) over rows [r0, r1), four rows at a time so that acc is read and
// written once per four rows (the loads and stores of acc, not the arithmetic, bound a
// row-at-a-time loop).
template <class Term>
[[gnu::always_inline]] inline void add_rows(int64_t r0, int64_t r1, int64_t channels,
                                            double* __restrict acc, Term term) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
    for (int64_t c = 0; c < channels; ++c)
      acc[c] += (term(r, c) + term(r + 1, c)) + (term(r + 2, c) + term(r + 3, c));
  for (; r < r1; ++r)
    for (int64_t c = 0; c < channels; ++c) acc[c] += term(r, c);
}

// channel_moments of a channels_last x, seen as [rows, C], in one pass over x: per channel
// the sums of d = x - k and of d^2, k being the channel's first value, in f64. Then mean =
// k + S1 / n and var = S2 / n - (S1 / n)^2: shifted by a value of the channel, the two terms
// are of the variance's own size unless k lies far out in the distribution, so the
// difference keeps f64's digits (a second pass over the deviations, as NCHW does while its
// channel is in cache, would read all of x again from memory here).
void channel_moments_nhwc(const Tensor& x, const ChannelLayout& s, std::vector<double>& mean,
                          std::vector<double>& var) {
  const int64_t count = s.rows(), channels = s.c;
  visit_floating(x.dtype(), "batch_norm", [&]<class T>() {
    const T* __restrict xs = x.data_ptr<T>();
    std::vector<double> shift(static_cast<size_t>(channels), 0.0);
    if (count > 0)
      for (int64_t c = 0; c < channels; ++c) shift[static_cast<size_t>(c)] = to_double(xs[c]);
    const double* __restrict k = shift.data();
    const std::vector<double> sums =
        row_block_sums(count, channels, 2, [xs, k, channels](int64_t r0, int64_t r1, double* acc) {
          with_wide<T>([&]() __attribute__((always_inline)) {
            double* __restrict s1 = acc;
            double* __restrict s2 = acc + channels;
            for (int64_t r = r0; r < r1; ++r) {
              const T* __restrict row = xs + r * channels;
              for (int64_t c = 0; c < channels; ++c) {
                const double d = to_double(row[c]) - k[c];
                s1[c] += d;
                s2[c] += d * d;
              }
            }
          });
        });
    mean.assign(static_cast<size_t>(channels), 0.0);
    var.assign(static_cast<size_t>(channels), 0.0);
    const double n = static_cast<double>(count);
    for (int64_t c = 0; c < channels; ++c) {
      const double m1 = sums[static_cast<size_t>(c)] / n;
      mean[static_cast<size_t>(c)] = k[c] + m1;
      var[static_cast<size_t>(c)] = std::max(0.0, sums[static_cast<size_t>(channels + c)] / n - m1 * m1);
    }
  });
}

// The NCHW inner loops of batch norm's forward over one row of a channel: the sum, the sum
// of squared deviations from m, and y = x * sc + sh. For 16-bit inputs they run in the
// AVX-512 build where the CPU has it (kernels/cpu/loops.h): at SSE2's width the
// conversions made bf16 twice f32's time. Same operations in the same order: same bits.
template <class T>
[[gnu::always_inline]] inline double row_sum(const T* p, int64_t n) {
  return accumulate(n, [p](int64_t i) __attribute__((always_inline)) { return to_double(p[i]); });
}
template <class T>
[[gnu::always_inline]] inline double row_squares(const T* p, int64_t n, double m) {
  return accumulate(n, [p, m](int64_t i) __attribute__((always_inline)) {
    const double d = to_double(p[i]) - m;
    return d * d;
  });
}
template <class T, class C>
[[gnu::always_inline]] inline void row_affine(const T* p, T* q, int64_t n, C sc, C sh) {
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<T>(static_cast<C>(p[i]) * sc + sh);
}

template <class T>
KILN_WIDE_LOOP double row_sum_wide(const T* p, int64_t n) { return row_sum(p, n); }
template <class T>
KILN_WIDE_LOOP double row_squares_wide(const T* p, int64_t n, double m) { return row_squares(p, n, m); }
template <class T, class C>
KILN_WIDE_LOOP void row_affine_wide(const T* p, T* q, int64_t n, C sc, C sh) { row_affine(p, q, n, sc, sh); }

template <class T>
double channel_row_sum(const T* p, int64_t n) {
  if constexpr (is_16bit_float<T>)
    if (wide_loops()) return row_sum_wide(p, n);
  return row_sum(p, n);
}
template <class T>
double channel_row_squares(const T* p, int64_t n, double m) {
  if constexpr (is_16bit_float<T>)
    if (wide_loops()) return row_squares_wide(p, n, m);
  return row_squares(p, n, m);
}
template <class T, class C>
void channel_row_affine(const T* p, T* q, int64_t n, C sc, C sh) {
  if constexpr (is_16bit_float<T>)
    if (wide_loops()) return row_affine_wide(p, q, n, sc, sh);
  row_affine(p, q, n, sc, sh);
}

// Per channel of x (contiguous in its layout): the mean and the biased variance, in f64.
// Each channel (NCHW) or block of rows (NHWC) is summed in a fixed order, so the result
// does not depend on the thread count: batch_norm and batch_norm_stats_update agree bit for
// bit.
void channel_moments(const Tensor& x, const ChannelLayout& s, std::vector<double>& mean,
                     std::vector<double>& var) {
  if (s.channels_last) return channel_moments_nhwc(x, s, mean, var);
  mean.assign(static_cast<size_t>(s.c), 0.0);
  var.assign(static_cast<size_t>(s.c), 0.0);
  const int64_t count = s.n * s.l;
  visit_floating(x.dtype(), "batch_norm", [&]<class T>() {
    const T* xs = x.data_ptr<T>();
    parallel_for(s.c, grain_for(count), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        double sum = 0;
        for (int64_t n = 0; n < s.n; ++n) {
          sum += channel_row_sum(xs + (n * s.c + c) * s.l, s.l);
        }
        const double m = sum / static_cast<double>(count);
        // A second pass over the deviations keeps the variance accurate for large means.
        double sq = 0;
        for (int64_t n = 0; n < s.n; ++n) {
          sq += channel_row_squares(xs + (n * s.c + c) * s.l, s.l, m);
        }
        mean[c] = m;
        var[c] = sq / static_cast<double>(count);
      }
    });
  });
}

// The running statistics' update, r = (1 - momentum) r + momentum s with the unbiased
// variance for running_var: reads running_mean and running_var, writes the new values into
// new_mean and new_var (the same tensors for batch_norm's in-place update).
void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const Tensor& new_mean, const Tensor& new_var,
                          const std::vector<double>& mean, const std::vector<double>& var,
                          int64_t count, double momentum) {
  const int64_t channels = static_cast<int64_t>(mean.size());
  std::vector<double> rm = read_values(running_mean, channels, 0.0);
  std::vector<double> rv = read_values(running_var, channels, 0.0);
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  for (int64_t c = 0; c < channels; ++c) {
    rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
    rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * unbias;
  }
  write_values(new_mean, rm);
  write_values(new_var, rv);
}

double momentum_of(const Attrs& attrs) { return attrs.has("momentum") ? attrs.f("momentum") : 0.1; }

// batch_norm, and batch_norm_update when new_mean and new_var are given: the running
// statistics read from in[3] and in[4] (when defined) and their update written into
// new_mean and new_var (in place for batch_norm).
void batch_norm_into(Span in, Span out, const Attrs& attrs, const Tensor& new_mean, const Tensor& new_var) {
  const bool training = attrs.b("training");
  const double momentum = momentum_of(attrs);
  const double eps = attrs.has("eps") ? attrs.f("eps") : 1e-5;
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  const ChannelLayout s = channel_layout(x, format);
  const bool has_running = in[3].defined();
  const std::vector<double> weight = read_values(in[1], s.c, 1.0),
                            bias = read_values(in[2], s.c, 0.0);
  std::vector<double> mean(static_cast<size_t>(s.c)), invstd(static_cast<size_t>(s.c));
  const int64_t count = s.n * s.l;

  if (training) {
    std::vector<double> var;
    channel_moments(x, s, mean, var);
    for (int64_t c = 0; c < s.c; ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    if (has_running) update_running_stats(in[3], in[4], new_mean, new_var, mean, var, count, momentum);
  } else {
    mean = read_values(in[3], s.c, 0.0);
    const std::vector<double> var = read_values(in[4], s.c, 1.0);
    for (int64_t c = 0; c < s.c; ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps);
  }
  visit_floating(x.dtype(), "batch_norm", [&]<class T>() {
    using C = compute_t<T>;
    // y = x * scale + shift per channel.
    std::vector<C> scale(static_cast<size_t>(s.c)), shift(static_cast<size_t>(s.c));
    for (int64_t c = 0; c < s.c; ++c) {
      scale[c] = static_cast<C>(invstd[c] * weight[c]);
      shift[c] = static_cast<C>(bias[c] - mean[c] * invstd[c] * weight[c]);
    }
    const T* xs = x.data_ptr<T>();
    into_layout(out[0], x.dtype(), format, [&](const Tensor& y) {
      T* ys = y.data_ptr<T>();
      if (s.channels_last) {
        const C* sc = scale.data();
        const C* sh = shift.data();
        const int64_t channels = s.c;
        parallel_for(s.rows(), grain_for(s.c), [&](int64_t b, int64_t e) {
          with_wide<T>([&]() __attribute__((always_inline)) {
            for (int64_t r = b; r < e; ++r) {
              const T* __restrict p = xs + r * channels;
              T* __restrict q = ys + r * channels;
              for (int64_t c = 0; c < channels; ++c)
                q[c] = static_cast<T>(static_cast<C>(p[c]) * sc[c] + sh[c]);
            }
          });
        });
        return;
      }
      parallel_for(s.c, grain_for(count), [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const C sc = scale[c], sh = shift[c];
          for (int64_t n = 0; n < s.n; ++n) {
            const T* p = xs + (n * s.c + c) * s.l;
            T* q = ys + (n * s.c + c) * s.l;
            channel_row_affine(p, q, s.l, sc, sh);
          }
        }
      });
    });
  });
  write_values(out[1], mean);
  write_values(out[2], invstd);
}

void batch_norm(Span in, Span out, const Attrs& attrs) { batch_norm_into(in, out, attrs, in[3], in[4]); }

// (input, weight?, bias?, running_mean, running_var) -> (out, save_mean, save_invstd,
// new_running_mean, new_running_var): one pass of statistics for both.
void batch_norm_update(Span in, Span out, const Attrs& attrs) {
  batch_norm_into(in, out.subspan(0, 3), attrs, out[3], out[4]);
}

// batch_norm's running-statistics update as a pure op: the batch statistics recomputed
// from the input exactly as batch_norm computes them, so the new values are bit for bit
// what batch_norm would have written in place.
void batch_norm_stats_update(Span in, Span out, const Attrs& attrs) {
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  const ChannelLayout s = channel_layout(x, format);
  std::vector<double> mean, var;
  channel_moments(x, s, mean, var);
  update_running_stats(in[1], in[2], out[0], out[1], mean, var, s.n * s.l, momentum_of(attrs));
}

// The per-channel factors of batch_norm's input gradient, dx = (dy - mean_dy - (x - mean) k)
// scale, from the sums of dy and dy (x - mean): with batch statistics, which depend on x, all
// three terms; with running statistics, only the first remains.
struct GradFactors {
  std::vector<double> mean_dy, k, scale;
};
GradFactors grad_factors(const std::vector<double>& sum_dy, const std::vector<double>& sum_dy_xmu,
                         const std::vector<double>& weight, const std::vector<double>& invstd,
                         int64_t count, bool training) {
  const size_t channels = sum_dy.size();
  GradFactors f{std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0),
                std::vector<double>(channels)};
  for (size_t c = 0; c < channels; ++c) {
    if (training) {
      f.k[c] = sum_dy_xmu[c] * invstd[c] * invstd[c] / static_cast<double>(count);
      f.mean_dy[c] = sum_dy[c] / static_cast<double>(count);
    }
    f.scale[c] = weight[c] * invstd[c];
  }
  return f;
}

// batch_norm_backward over NHWC x and grad seen as [rows, C]: the sums in row blocks, then dx
// row by row with per-channel vectors.
template <class T>
void batch_norm_backward_nhwc(const T* xs, const T* gs, T* dxs, const ChannelLayout& s,
                              const std::vector<double>& weight, const std::vector<double>& mean,
                              const std::vector<double>& invstd, bool training,
                              std::vector<double>& grad_weight, std::vector<double>& grad_bias) {
  using C = compute_t<T>;
  const int64_t channels = s.c, rows = s.rows();
  const double* m = mean.data();
  // acc[c]: the sum of dy; acc[C + c]: the sum of dy (x - mean). One pass over rows of x
  // and dy, four rows at a time (as add_rows).
  const std::vector<double> sums =
      row_block_sums(rows, channels, 2, [&](int64_t r0, int64_t r1, double* acc) {
        with_wide<T>([&]() __attribute__((always_inline)) {
          double* __restrict sum_dy = acc;
          double* __restrict sum_dy_xmu = acc + channels;
          auto dy = [gs, channels](int64_t r, int64_t c) __attribute__((always_inline)) {
            return to_double(gs[r * channels + c]);
          };
          auto dy_xmu = [xs, gs, m, channels](int64_t r, int64_t c) __attribute__((always_inline)) {
            const int64_t i = r * channels + c;
            return to_double(gs[i]) * (to_double(xs[i]) - m[c]);
          };
          int64_t r = r0;
          for (; r + 4 <= r1; r += 4) {
            for (int64_t c = 0; c < channels; ++c) {
              sum_dy[c] += (dy(r, c) + dy(r + 1, c)) + (dy(r + 2, c) + dy(r + 3, c));
              sum_dy_xmu[c] +=
                  (dy_xmu(r, c) + dy_xmu(r + 1, c)) + (dy_xmu(r + 2, c) + dy_xmu(r + 3, c));
            }
          }
          for (; r < r1; ++r) {
            for (int64_t c = 0; c < channels; ++c) {
              sum_dy[c] += dy(r, c);
              sum_dy_xmu[c] += dy_xmu(r, c);
            }
          }
        });
      });
  const std::vector<double> sum_dy(sums.begin(), sums.begin() + channels);
  const std::vector<double> sum_dy_xmu(sums.begin() + channels, sums.end());
  for (int64_t c = 0; c < channels; ++c) {
    grad_bias[c] = sum_dy[c];
    grad_weight[c] = sum_dy_xmu[c] * invstd[c];
  }
  const GradFactors f = grad_factors(sum_dy, sum_dy_xmu, weight, invstd, rows, training);
  std::vector<C> mc(static_cast<size_t>(channels)), dc(mc), kc(mc), sc(mc);
  for (int64_t c = 0; c < channels; ++c) {
    mc[c] = static_cast<C>(mean[c]);
    dc[c] = static_cast<C>(f.mean_dy[c]);
    kc[c] = static_cast<C>(f.k[c]);
    sc[c] = static_cast<C>(f.scale[c]);
  }
  const C *mp = mc.data(), *dp = dc.data(), *kp = kc.data(), *sp = sc.data();
  parallel_for(rows, grain_for(channels), [&](int64_t b, int64_t e) {
    with_wide<T>([&]() __attribute__((always_inline)) {
      for (int64_t r = b; r < e; ++r) {
        const T* __restrict xp = xs + r * channels;
        const T* __restrict gp = gs + r * channels;
        T* __restrict out = dxs + r * channels;
        for (int64_t c = 0; c < channels; ++c) {
          const C dy = static_cast<C>(gp[c]), xmu = static_cast<C>(xp[c]) - mp[c];
          out[c] = static_cast<T>((dy - dp[c] - xmu * kp[c]) * sp[c]);
        }
      }
    });
  });
}

// batch_norm_backward over NCHW x and grad seen as [N, C, L]: one thread per channel.
template <class T>
void batch_norm_backward_nchw(const T* xs, const T* gs, T* dxs, const ChannelLayout& s,
                              const std::vector<double>& weight, const std::vector<double>& mean,
                              const std::vector<double>& invstd, bool training,
                              std::vector<double>& grad_weight, std::vector<double>& grad_bias) {
  using C = compute_t<T>;
  const int64_t count = s.n * s.l;
  parallel_for(s.c, grain_for(count), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const double m = mean[c];
      double sum_dy = 0, sum_dy_xmu = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const T* xp = xs + (n * s.c + c) * s.l;
        const T* gp = gs + (n * s.c + c) * s.l;
        sum_dy += accumulate(s.l, [gp](int64_t i) { return to_double(gp[i]); });
        sum_dy_xmu += accumulate(
            s.l, [xp, gp, m](int64_t i) { return to_double(gp[i]) * (to_double(xp[i]) - m); });
      }
      grad_bias[c] = sum_dy;
      grad_weight[c] = sum_dy_xmu * invstd[c];
      // The factors grad_factors gives, one channel at a time.
      const double k =
          training ? sum_dy_xmu * invstd[c] * invstd[c] / static_cast<double>(count) : 0.0;
      const double mean_dy = training ? sum_dy / static_cast<double>(count) : 0.0;
      const C scale = static_cast<C>(weight[c] * invstd[c]);
      const C kc = static_cast<C>(k), mc = static_cast<C>(m), dc = static_cast<C>(mean_dy);
      for (int64_t n = 0; n < s.n; ++n) {
        const T* xp = xs + (n * s.c + c) * s.l;
        const T* gp = gs + (n * s.c + c) * s.l;
        T* dp = dxs + (n * s.c + c) * s.l;
        for (int64_t i = 0; i < s.l; ++i) {
          const C dy = static_cast<C>(gp[i]), xmu = static_cast<C>(xp[i]) - mc;
          dp[i] = static_cast<T>((dy - dc - xmu * kc) * scale);
        }
      }
    }
  });
}

void batch_norm_backward(Span in, Span out, const Attrs& attrs) {
  const bool training = attrs.b("training");
  // The shape rule's layout of grad_input: the input's, or grad_out's when the input is
  // contiguous.
  const MemoryFormat format = in[1].suggest_memory_format() == MemoryFormat::channels_last
                                  ? MemoryFormat::channels_last
                                  : in[0].suggest_memory_format();
  const Tensor x = in[1].contiguous(format);
  const Tensor grad = as_dtype(in[0], x.dtype()).contiguous(format);
  const ChannelLayout s = channel_layout(x, format);
  const std::vector<double> weight = read_values(in[2], s.c, 1.0);
  const std::vector<double> mean = read_values(in[3], s.c, 0.0);
  const std::vector<double> invstd = read_values(in[4], s.c, 0.0);
  std::vector<double> grad_weight(static_cast<size_t>(s.c)), grad_bias(static_cast<size_t>(s.c));

  visit_floating(x.dtype(), "batch_norm_backward", [&]<class T>() {
    into_layout(out[0], x.dtype(), format, [&](const Tensor& dx) {
      const auto run = s.channels_last ? batch_norm_backward_nhwc<T> : batch_norm_backward_nchw<T>;
      run(x.data_ptr<T>(), grad.data_ptr<T>(), dx.data_ptr<T>(), s, weight, mean, invstd, training,
          grad_weight, grad_bias);
    });
  });
  write_values(out[1], grad_weight);
  write_values(out[2], grad_bias);
}

// batch_norm_train_stats (compiler/passes/batch_norm_split.cpp): batch_norm_update's
// statistics and running-statistics update, and its output's factors scale and shift,
// computed and rounded as batch_norm_into computes them, so x * scale + shift is its output.
void batch_norm_train_stats(Span in, Span out, const Attrs& attrs) {
  const double eps = attrs.has("eps") ? attrs.f("eps") : 1e-5;
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  const ChannelLayout s = channel_layout(x, format);
  const std::vector<double> weight = read_values(in[1], s.c, 1.0), bias = read_values(in[2], s.c, 0.0);
  std::vector<double> mean, var;
  channel_moments(x, s, mean, var);
  const auto channels = static_cast<size_t>(s.c);
  std::vector<double> invstd(channels), scale(channels), shift(channels);
  for (size_t c = 0; c < channels; ++c) {
    invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    scale[c] = invstd[c] * weight[c];
    shift[c] = bias[c] - mean[c] * invstd[c] * weight[c];
  }
  update_running_stats(in[3], in[4], out[2], out[3], mean, var, s.n * s.l, momentum_of(attrs));
  write_values(out[0], mean);
  write_values(out[1], invstd);
  write_values(out[4], scale);
  write_values(out[5], shift);
}

// The per-channel sums of batch_norm_backward, sum dy and sum dy (x - mean), in its order
// (so the same bits); dy is grad, or where(relu > 0, grad, 0) when relu is given.
template <class T>
void grad_sums(const T* xs, const T* gs, const T* rs, const ChannelLayout& s, const std::vector<double>& mean,
               std::vector<double>& sum_dy, std::vector<double>& sum_dy_xmu) {
  const int64_t channels = s.c;
  sum_dy.assign(static_cast<size_t>(channels), 0.0);
  sum_dy_xmu.assign(static_cast<size_t>(channels), 0.0);
  const double* m = mean.data();
  auto dy_at = [gs, rs](int64_t i) __attribute__((always_inline)) {
    return rs && !(static_cast<compute_t<T>>(rs[i]) > 0) ? 0.0 : to_double(gs[i]);
  };
  if (s.channels_last) {
    const std::vector<double> sums =
        row_block_sums(s.rows(), channels, 2, [&](int64_t r0, int64_t r1, double* acc) {
          with_wide<T>([&]() __attribute__((always_inline)) {
            double* __restrict a_dy = acc;
            double* __restrict a_xmu = acc + channels;
            auto dy = [&](int64_t r, int64_t c) __attribute__((always_inline)) { return dy_at(r * channels + c); };
            auto dy_xmu = [&](int64_t r, int64_t c) __attribute__((always_inline)) {
              const int64_t i = r * channels + c;
              return dy_at(i) * (to_double(xs[i]) - m[c]);
            };
            int64_t r = r0;
            for (; r + 4 <= r1; r += 4) {
              for (int64_t c = 0; c < channels; ++c) {
                a_dy[c] += (dy(r, c) + dy(r + 1, c)) + (dy(r + 2, c) + dy(r + 3, c));
                a_xmu[c] += (dy_xmu(r, c) + dy_xmu(r + 1, c)) + (dy_xmu(r + 2, c) + dy_xmu(r + 3, c));
              }
            }
            for (; r < r1; ++r) {
              for (int64_t c = 0; c < channels; ++c) {
                a_dy[c] += dy(r, c);
                a_xmu[c] += dy_xmu(r, c);
              }
            }
          });
        });
    for (int64_t c = 0; c < channels; ++c) {
      sum_dy[static_cast<size_t>(c)] = sums[static_cast<size_t>(c)];
      sum_dy_xmu[static_cast<size_t>(c)] = sums[static_cast<size_t>(channels + c)];
    }
    return;
  }
  parallel_for(s.c, grain_for(s.n * s.l), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const double mc = m[c];
      double a = 0, ax = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t base = (n * s.c + c) * s.l;
        a += accumulate(s.l, [&](int64_t i) { return dy_at(base + i); });
        ax += accumulate(s.l, [&](int64_t i) { return dy_at(base + i) * (to_double(xs[base + i]) - mc); });
      }
      sum_dy[static_cast<size_t>(c)] = a;
      sum_dy_xmu[static_cast<size_t>(c)] = ax;
    }
  });
}

// batch_norm_grad_stats (compiler/passes/batch_norm_split.cpp): (grad_out, x, weight?,
// save_mean, save_invstd, relu_out?) -> (grad_weight, grad_bias, mean_dy, k, scale), the
// values and factors batch_norm_backward (training) computes, rounded as it rounds them.
void batch_norm_grad_stats(Span in, Span out, const Attrs&) {
  const MemoryFormat format = in[1].suggest_memory_format() == MemoryFormat::channels_last
                                  ? MemoryFormat::channels_last
                                  : in[0].suggest_memory_format();
  const Tensor x = in[1].contiguous(format);
  Tensor grad = as_dtype(in[0], x.dtype()).contiguous(format);
  Tensor relu;
  if (in[5].defined()) {
    if (in[5].dtype() == x.dtype()) {
      relu = in[5].contiguous(format);
    } else {  // the mask applied apart: a relu output of another dtype is compared in its own
      NoGradGuard no_grad;
      grad = as_dtype(where(in[5] > 0, in[0], 0), x.dtype()).contiguous(format);
    }
  }
  const ChannelLayout s = channel_layout(x, format);
  const std::vector<double> weight = read_values(in[2], s.c, 1.0);
  const std::vector<double> mean = read_values(in[3], s.c, 0.0);
  const std::vector<double> invstd = read_values(in[4], s.c, 0.0);
  std::vector<double> sum_dy, sum_dy_xmu;
  visit_floating(x.dtype(), "batch_norm_grad_stats", [&]<class T>() {
    grad_sums<T>(x.data_ptr<T>(), grad.data_ptr<T>(), relu.defined() ? relu.data_ptr<T>() : nullptr, s, mean, sum_dy,
                 sum_dy_xmu);
  });
  std::vector<double> grad_weight(sum_dy.size());
  for (size_t c = 0; c < sum_dy.size(); ++c) grad_weight[c] = sum_dy_xmu[c] * invstd[c];
  const GradFactors f = grad_factors(sum_dy, sum_dy_xmu, weight, invstd, s.n * s.l, true);
  write_values(out[0], grad_weight);
  write_values(out[1], sum_dy);
  write_values(out[2], f.mean_dy);
  write_values(out[3], f.k);
  write_values(out[4], f.scale);
}

void layer_norm(Span in, Span out, const Attrs& attrs) {
  const double eps = attrs.has("eps") ? attrs.f("eps") : 1e-5;
  const Tensor x = in[0].contiguous();
  const int64_t k = numel_of(attrs.ints("normalized_shape"));
  const int64_t rows = k ? x.numel() / k : 0;
  visit_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using C = compute_t<T>;
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    static_assert(std::is_same_v<C, S>);
    const Tensor w = in[1].defined() ? in_compute_dtype(in[1], x.dtype()) : Tensor();
    const Tensor bias = in[2].defined() ? in_compute_dtype(in[2], x.dtype()) : Tensor();
    const C* wp = w.defined() ? w.data_ptr<C>() : nullptr;
    const C* bp = bias.defined() ? bias.data_ptr<C>() : nullptr;
    const T* xs = x.data_ptr<T>();
    T* ys = out[0].data_ptr<T>();
    S* means = out[1].data_ptr<S>();
    S* rstds = out[2].data_ptr<S>();
    parallel_for(rows, grain_for(k), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* p = xs + r * k;
        T* q = ys + r * k;
        const double m =
            accumulate(k, [p](int64_t i) { return to_double(p[i]); }) / static_cast<double>(k);
        const double var = accumulate(k,
                                      [p, m](int64_t i) {
                                        const double d = to_double(p[i]) - m;
                                        return d * d;
                                      }) /
                           static_cast<double>(k);
        const double rs = 1.0 / std::sqrt(var + eps);
        means[r] = static_cast<S>(m);
        rstds[r] = static_cast<S>(rs);
        const C mc = static_cast<C>(m), rc = static_cast<C>(rs);
        if (wp && bp) {
          for (int64_t i = 0; i < k; ++i)
            q[i] = static_cast<T>((static_cast<C>(p[i]) - mc) * rc * wp[i] + bp[i]);
        } else if (wp) {
          for (int64_t i = 0; i < k; ++i)
            q[i] = static_cast<T>((static_cast<C>(p[i]) - mc) * rc * wp[i]);
        } else if (bp) {
          for (int64_t i = 0; i < k; ++i)
            q[i] = static_cast<T>((static_cast<C>(p[i]) - mc) * rc + bp[i]);
        } else {
          for (int64_t i = 0; i < k; ++i) q[i] = static_cast<T>((static_cast<C>(p[i]) - mc) * rc);
        }
      }
    });
  });
}

void layer_norm_backward(Span in, Span out, const Attrs& attrs) {
  const Tensor x = in[1].contiguous();
  const Tensor grad = as_dtype(in[0], x.dtype()).contiguous();
  const int64_t k = numel_of(attrs.ints("normalized_shape"));
  const int64_t rows = k ? x.numel() / k : 0;
  const Tensor mean = in_compute_dtype(in[2], x.dtype()), rstd = in_compute_dtype(in[3], x.dtype());
  // Each thread sums grad_weight and grad_bias over its rows; the partial sums are added in
  // row order afterwards, so the result does not depend on thread timing.
  std::mutex partials_mutex;
  std::vector<std::pair<int64_t, std::vector<double>>> partials;
  visit_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    using C = compute_t<T>;
    const Tensor w = in[4].defined() ? in_compute_dtype(in[4], x.dtype()) : Tensor();
    const C* wp = w.defined() ? w.data_ptr<C>() : nullptr;
    const C* ms = mean.data_ptr<C>();
    const C* rs = rstd.data_ptr<C>();
    const T* xs = x.data_ptr<T>();
    const T* gs = grad.data_ptr<T>();
    T* dxs = out[0].data_ptr<T>();
    parallel_for(rows, grain_for(k), [&](int64_t b, int64_t e) {
      std::vector<double> sums(static_cast<size_t>(2 * k), 0.0);  // grad_weight, grad_bias
      double* dw = sums.data();
      double* db = sums.data() + k;
      std::vector<C> xhat(static_cast<size_t>(k)), gw(static_cast<size_t>(k));
      for (int64_t r = b; r < e; ++r) {
        const T* xp = xs + r * k;
        const T* gp = gs + r * k;
        T* dp = dxs + r * k;
        const C m = ms[r], rstd_r = rs[r];
        for (int64_t i = 0; i < k; ++i) {
          xhat[i] = (static_cast<C>(xp[i]) - m) * rstd_r;
          gw[i] = wp ? static_cast<C>(gp[i]) * wp[i] : static_cast<C>(gp[i]);
        }
        for (int64_t i = 0; i < k; ++i) {
          const double dy = to_double(gp[i]);
          dw[i] += dy * static_cast<double>(xhat[i]);
          db[i] += dy;
        }
        // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w
        const double mean_g = accumulate(k, [&](int64_t i) { return static_cast<double>(gw[i]); }) /
                              static_cast<double>(k);
        const double mean_gx =
            accumulate(k,
                       [&](int64_t i) {
                         return static_cast<double>(gw[i]) * static_cast<double>(xhat[i]);
                       }) /
            static_cast<double>(k);
        const C a = static_cast<C>(mean_g), c = static_cast<C>(mean_gx);
        for (int64_t i = 0; i < k; ++i) dp[i] = static_cast<T>(rstd_r * (gw[i] - a - xhat[i] * c));
      }
      std::lock_guard lock(partials_mutex);
      partials.emplace_back(b, std::move(sums));
    });
  });
  std::sort(partials.begin(), partials.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<double> grad_weight(static_cast<size_t>(k), 0.0),
      grad_bias(static_cast<size_t>(k), 0.0);
  for (const auto& [begin, sums] : partials) {
    for (int64_t i = 0; i < k; ++i) {
      grad_weight[i] += sums[i];
      grad_bias[i] += sums[k + i];
    }
  }
  write_values(out[1].view({k}), grad_weight);
  write_values(out[2].view({k}), grad_bias);
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("batch_norm", cpu, batch_norm);
    register_kernel("batch_norm_backward", cpu, batch_norm_backward);
    register_kernel("batch_norm_stats_update", cpu, batch_norm_stats_update);
    register_kernel("batch_norm_update", cpu, batch_norm_update);
    register_kernel("batch_norm_train_stats", cpu, batch_norm_train_stats);
    register_kernel("batch_norm_grad_stats", cpu, batch_norm_grad_stats);
    register_kernel("layer_norm", cpu, layer_norm);
    register_kernel("layer_norm_backward", cpu, layer_norm_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
