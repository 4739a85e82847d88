#pragma once
// The channels-last (NHWC) convolution algorithms of kernels/cpu/conv.cpp, which holds the
// NCHW ones and the kernels that choose between them; also the two helpers both use.
#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/ops/conv.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu::conv_nhwc {

// A 1x1, stride-1, unpadded convolution: its input is its own column matrix.
inline bool is_pointwise(const Conv2dGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 &&
         g.pad_w == 0;
}

// Enough planes per thread to pay for starting the threads.
inline int64_t plane_grain(int64_t work_per_plane) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work_per_plane));
}

// ---- channels-last (NHWC) ----
//
// With the activations stored NHWC, every output pixel is one row of a matrix: the
// forward is out[M, Co] = col[M, K] x W'[Co, K]^T with M = N * OH * OW output pixels and
// K = kh * kw * Ci (see ColumnOrder for the order of K); backward_input is
// gcol[M, K] = grad[M, Co] x W'[Co, K] then col2im; backward_weight sums
// grad[M, Co]^T x col[M, K]. A 1x1 stride-1 unpadded conv needs no im2col: the input is
// the [M, Ci] matrix. Unlike NCHW the GEMMs span the whole batch, so small planes
// (ResNet's 2x2 and 4x4 stages) still give them M in the tens to hundreds. groups == 1
// only; grouped convolutions take the NCHW path.

// The rows (output pixels) are cut into one contiguous part per thread, each running its
// tiles with single-threaded GEMMs, when every part gets at least kMinPartRows rows (and,
// for backward_input, whole images: its col2im scatters across the rows of an image);
// else one part whose GEMMs use the threads (small planes: GEMMs of few rows and large
// weights, which the GEMM's own threads split better, and backward_weight would need a
// weight-sized sum per part). A part runs its rows a tile at a time: kNhwcTileBytes of
// columns but at least kMinTileRows rows (measured on ResNet-50's 3x3 convs at 8x8 and
// 16x16: 128-row tiles ran backward_input and backward_weight up to 40% slower than
// 512-row ones; longer tiles did not help), and at most kMaxTileBytes.
constexpr int64_t kMinPartRows = 256;
constexpr int64_t kMinTileRows = 512;
constexpr int64_t kNhwcTileBytes = int64_t{1} << 20;
constexpr int64_t kMaxTileBytes = int64_t{1} << 24;

struct PixelPlan {
  int64_t rows;       // M
  int64_t align;      // parts hold whole multiples of this many rows
  int64_t parts;      // contiguous ranges, one per thread (1: GEMMs use the threads)
  int64_t tile_rows;  // rows per im2col tile

  PixelPlan(const Conv2dGeometry& g, int64_t col_width, size_t itemsize, bool whole_images)
      : rows(g.batch * g.out_h * g.out_w), align(whole_images ? g.out_h * g.out_w : 1) {
    const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const int64_t units = rows / std::max<int64_t>(1, align);
    parts = std::min(threads, units);
    if (parts < 2 || rows / parts < kMinPartRows) parts = 1;
    const int64_t row_bytes = std::max<int64_t>(1, col_width * static_cast<int64_t>(itemsize));
    tile_rows = std::min(std::max(kMinTileRows, kNhwcTileBytes / row_bytes),
                         std::max<int64_t>(1, kMaxTileBytes / row_bytes));
  }
  // The rows [begin, end) of part p.
  std::pair<int64_t, int64_t> part(int64_t p) const {
    if (parts == 1) return {0, rows};
    const int64_t units = rows / align;
    return {p * units / parts * align, (p + 1) * units / parts * align};
  }
  // Runs body(p, begin, end) for every part, on the threads when there are several.
  template <class Body>
  void for_each_part(Body&& body) const {
    parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const auto [begin, end] = part(p);
        body(p, begin, end);
      }
    });
  }
  // Runs tile(begin, end) for the tiles of the rows [begin, end).
  template <class Tile>
  void for_each_tile(int64_t begin, int64_t end, Tile&& tile) const {
    for (int64_t m = begin; m < end; m += tile_rows) tile(m, std::min(end, m + tile_rows));
  }
};

// The order of the K = kh * kw * Ci entries of a column row, and so of the weight's K axis.
// taps_outer (tap, channel): im2col copies Ci-long runs of the input (whole kernel rows
// at once without dilation), but the weight must be reordered to [Co, kh, kw, Ci] (its
// channels_last layout) and backward_weight's result back. channels_outer (channel, tap):
// the weight as stored, [Co, Ci, kh, kw], but im2col writes each run strided, kh * kw
// apart. The reorder costs Co * K element moves per call, the strided writes about the
// same again per column element (M * K): taps_outer unless the output channels outnumber
// the pixels (the last stages' 3x3 convs on 2x2 and 4x4 planes, whose weights are large).
// A 1x1 kernel's two orders are the same.
enum class ColumnOrder { taps_outer, channels_outer };

inline ColumnOrder column_order(const Conv2dGeometry& g, bool weight_is_nhwc) {
  const int64_t pixels = g.batch * g.out_h * g.out_w;
  return weight_is_nhwc || g.kernel_h * g.kernel_w == 1 || pixels >= g.out_channels
             ? ColumnOrder::taps_outer
             : ColumnOrder::channels_outer;
}

// The taps [first, last) of one kernel axis whose input coordinate base + tap * dilation
// lies in [0, size).
inline std::pair<int64_t, int64_t> valid_taps(int64_t base, int64_t dilation, int64_t size,
                                       int64_t taps) {
  const int64_t first = base >= 0 ? 0 : (-base + dilation - 1) / dilation;
  const int64_t last = base >= size ? 0 : (size - 1 - base) / dilation + 1;
  const int64_t f = std::min(first, taps);
  return {f, std::clamp(last, f, taps)};
}

// For the output pixel m, visit(tap, input_offset, count) for every run of `count`
// kernel taps from `tap` (row-major over kh x kw) that read `count` adjacent pixels inside
// the input from input_offset on (in elements, from the first image's start): the taps
// inside one kernel row without dilation, single taps with it.
template <class Visit>
void for_each_patch_run(const Conv2dGeometry& g, int64_t m, Visit&& visit) {
  const int64_t plane = g.out_h * g.out_w, ci = g.in_channels;
  const int64_t n = m / plane, oh = m % plane / g.out_w, ow = m % g.out_w;
  const int64_t base_h = oh * g.stride_h - g.pad_h, base_w = ow * g.stride_w - g.pad_w;
  const auto [ki0, ki1] = valid_taps(base_h, g.dilation_h, g.in_h, g.kernel_h);
  const auto [kj0, kj1] = valid_taps(base_w, g.dilation_w, g.in_w, g.kernel_w);
  for (int64_t ki = ki0; ki < ki1; ++ki) {
    const int64_t ih = base_h + ki * g.dilation_h;
    const int64_t pixel = (n * g.in_h + ih) * g.in_w + base_w;  // of tap kj = 0
    const int64_t tap = ki * g.kernel_w;
    if (g.dilation_w == 1) {
      if (kj1 > kj0) visit(tap + kj0, (pixel + kj0) * ci, kj1 - kj0);
    } else {
      for (int64_t kj = kj0; kj < kj1; ++kj) visit(tap + kj, (pixel + kj * g.dilation_w) * ci, 1);
    }
  }
}

// Whether every tap of the output pixel m reads inside the input (no padding).
inline bool pixel_is_inside(const Conv2dGeometry& g, int64_t m) {
  const int64_t plane = g.out_h * g.out_w;
  const int64_t oh = m % plane / g.out_w, ow = m % g.out_w;
  const int64_t base_h = oh * g.stride_h - g.pad_h, base_w = ow * g.stride_w - g.pad_w;
  return base_h >= 0 && base_w >= 0 && base_h + (g.kernel_h - 1) * g.dilation_h < g.in_h &&
         base_w + (g.kernel_w - 1) * g.dilation_w < g.in_w;
}

// col [end - begin, K] in `order`: the patches of the output pixels [begin, end) of
// x [N, H, W, Ci].
template <class T>
void im2col_nhwc(const T* x, const Conv2dGeometry& g, ColumnOrder order, int64_t begin,
                 int64_t end, T* col) {
  const int64_t ci = g.in_channels, taps = g.kernel_h * g.kernel_w, k = taps * ci;
  parallel_for(end - begin, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, k)),
               [&](int64_t b, int64_t e) {
                 for (int64_t m = begin + b; m < begin + e; ++m) {
                   T* row = col + (m - begin) * k;
                   // Padding taps read zeros: clear the row of a border pixel first.
                   if (!pixel_is_inside(g, m)) std::fill(row, row + k, T(0));
                   for_each_patch_run(g, m, [&](int64_t tap, int64_t in, int64_t count) {
                     const T* src = x + in;
                     if (order == ColumnOrder::taps_outer) {
                       std::copy(src, src + count * ci, row + tap * ci);
                       return;
                     }
                     for (int64_t j = 0; j < count; ++j)
                       for (int64_t c = 0; c < ci; ++c) row[c * taps + tap + j] = src[j * ci + c];
                   });
                 }
               });
}

// x [N, H, W, Ci] += the patches in col [end - begin, K] (in `order`) of the output pixels
// [begin, end): the adjoint of im2col_nhwc.
template <class T>
void col2im_nhwc(const T* col, const Conv2dGeometry& g, ColumnOrder order, int64_t begin,
                 int64_t end, T* x) {
  const int64_t ci = g.in_channels, taps = g.kernel_h * g.kernel_w, k = taps * ci;
  for (int64_t m = begin; m < end; ++m) {
    const T* row = col + (m - begin) * k;
    for_each_patch_run(g, m, [&](int64_t tap, int64_t in, int64_t count) {
      T* dst = x + in;
      if (order == ColumnOrder::taps_outer) {
        const T* src = row + tap * ci;
        for (int64_t j = 0; j < count * ci; ++j) dst[j] += src[j];
        return;
      }
      for (int64_t j = 0; j < count; ++j)
        for (int64_t c = 0; c < ci; ++c) dst[j * ci + c] += row[c * taps + tap + j];
    });
  }
}

// out [M, Co] = conv(x [N, H, W, Ci], w [Co, K] in `order`) + bias. x, w and the columns
// are of type S (T, or bf16 that the GEMM sums in T = float); bias and out of type T.
template <class S, class T>
void nhwc_forward(const S* x, const S* w, const T* bias, T* out, const Conv2dGeometry& g,
                  ColumnOrder order) {
  const int64_t co = g.out_channels, k = g.kernel_h * g.kernel_w * g.in_channels;
  const bool pointwise = is_pointwise(g);
  const PixelPlan plan(g, pointwise ? 0 : k, sizeof(S), false);
  plan.for_each_part([&](int64_t, int64_t begin, int64_t end) {
    std::vector<S> col(pointwise ? 0 : static_cast<size_t>(std::min(plan.tile_rows, end - begin) * k));
    plan.for_each_tile(begin, end, [&](int64_t m0, int64_t m1) {
      T* dst = out + m0 * co;
      if (bias)
        for (int64_t m = m0; m < m1; ++m) std::copy(bias, bias + co, dst + (m - m0) * co);
      if (!pointwise) im2col_nhwc(x, g, order, m0, m1, col.data());
      const S* a = pointwise ? x + m0 * k : col.data();
      gemm(false, true, m1 - m0, co, k, T(1), a, k, w, k, bias ? T(1) : T(0), dst, co);
    });
  });
}

// gin [N, H, W, Ci] = the adjoint of the convolution applied to grad [M, Co]; grad and w of
// type S, gin and the GEMM's columns of type T.
template <class S, class T>
void nhwc_backward_input(const S* grad, const S* w, T* gin, const Conv2dGeometry& g,
                         ColumnOrder order) {
  const int64_t co = g.out_channels, ci = g.in_channels, k = g.kernel_h * g.kernel_w * ci;
  const int64_t in_image = g.in_h * g.in_w * ci, plane = g.out_h * g.out_w;
  if (is_pointwise(g)) {  // gin [M, Ci] = grad [M, Co] x W [Co, Ci]
    gemm(false, false, g.batch * plane, ci, co, T(1), grad, co, w, k, T(0), gin, ci);
    return;
  }
  // Parts hold whole images: the patches of one image's pixels overlap in the input.
  const PixelPlan plan(g, k, sizeof(T), true);
  plan.for_each_part([&](int64_t, int64_t begin, int64_t end) {
    std::fill(gin + begin / plane * in_image, gin + end / plane * in_image, T(0));
    std::vector<T> col(static_cast<size_t>(std::min(plan.tile_rows, end - begin) * k));
    plan.for_each_tile(begin, end, [&](int64_t m0, int64_t m1) {
      gemm(false, false, m1 - m0, k, co, T(1), grad + m0 * co, co, w, k, T(0), col.data(), k);
      col2im_nhwc(col.data(), g, order, m0, m1, gin);
    });
  });
}

// gw [Co, K] in `order` = grad [M, Co]^T x col [M, K], summed over the pixels (added to
// what gw holds when `accumulate`); grad, x and the columns of type S, gw of type T.
template <class S, class T>
void nhwc_backward_weight(const S* grad, const S* x, T* gw, const Conv2dGeometry& g,
                          ColumnOrder order, bool accumulate) {
  const int64_t co = g.out_channels, k = g.kernel_h * g.kernel_w * g.in_channels;
  const bool pointwise = is_pointwise(g);
  const PixelPlan plan(g, pointwise ? 0 : k, sizeof(S), false);
  const int64_t weight_size = co * k;
  // Part 0 sums into gw, the others into their own buffers, added in part order so that the
  // result does not depend on the scheduling.
  std::vector<std::vector<T>> sums(static_cast<size_t>(plan.parts - 1));
  plan.for_each_part([&](int64_t p, int64_t begin, int64_t end) {
    T* acc = gw;
    if (p > 0) {
      sums[p - 1].resize(static_cast<size_t>(weight_size));
      acc = sums[p - 1].data();
    }
    if (p > 0 || !accumulate) std::fill(acc, acc + weight_size, T(0));
    std::vector<S> col(pointwise ? 0 : static_cast<size_t>(std::min(plan.tile_rows, end - begin) * k));
    plan.for_each_tile(begin, end, [&](int64_t m0, int64_t m1) {
      if (!pointwise) im2col_nhwc(x, g, order, m0, m1, col.data());
      const S* b = pointwise ? x + m0 * k : col.data();
      gemm(true, false, co, k, m1 - m0, T(1), grad + m0 * co, co, b, k, T(1), acc, k);
    });
  });
  for (const std::vector<T>& acc : sums)
    for (int64_t i = 0; i < weight_size; ++i) gw[i] += acc[i];
}

// Whether an activation is laid out NHWC for a convolution: channels_last, or of 1x1
// planes in and out (one pixel per image: NCHW and NHWC are the same memory; the NCHW
// algorithms would run one outer product per image).
inline bool nhwc_activation(const Tensor& activation, const Conv2dGeometry& g) {
  return activation.suggest_memory_format() == MemoryFormat::channels_last ||
         (g.in_h * g.in_w == 1 && g.out_h * g.out_w == 1);
}

// Whether a call whose activation is `activation` runs the NHWC algorithms: an NHWC
// activation of an ungrouped, non-empty convolution.
inline bool use_nhwc(const Tensor& activation, const Conv2dGeometry& g) {
  return nhwc_activation(activation, g) && g.groups == 1 &&
         g.batch > 0 && g.in_channels > 0 && g.out_channels > 0 && g.out_h > 0 && g.out_w > 0;
}

// t in dtype c laid out channels_last (t itself when it already is).
inline Tensor dense_nhwc(const Tensor& t, DType c) {
  return as_dtype(t, c).contiguous(MemoryFormat::channels_last);
}

// src [outer, a, b] -> dst [outer, b, a]: a weight's K axis from (channel, tap) to
// (tap, channel) order (a = Ci, b = kh * kw) or back (a = kh * kw, b = Ci). A loop of our
// own: the general strided copy takes several times longer for this permutation.
// With `add`, dst += the swapped src (a weight gradient summed into the one it is added to).
template <class T>
void swap_inner_axes(const T* src, T* dst, int64_t outer, int64_t a, int64_t b, bool add = false) {
  const int64_t size = a * b;
  parallel_for(outer, plane_grain(size), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const T* s = src + o * size;
      T* d = dst + o * size;
      for (int64_t i = 0; i < a; ++i)
        for (int64_t j = 0; j < b; ++j)
          d[j * a + i] = add ? T(d[j * a + i] + s[i * b + j]) : s[i * b + j];
    }
  });
}

// The weight as the [Co, K] matrix of `order`: w's own data (contiguous, or channels_last
// when w_nhwc) when it is stored so, else a reordered copy.
template <class T>
struct WeightMatrix {
  std::vector<T> reordered;
  const T* data;
  WeightMatrix(const Tensor& w, bool w_nhwc, const Conv2dGeometry& g, ColumnOrder order)
      : data(w.data_ptr<T>()) {
    if (order == ColumnOrder::taps_outer && !w_nhwc) {
      reordered.resize(static_cast<size_t>(w.numel()));
      swap_inner_axes(data, reordered.data(), g.out_channels, g.in_channels,
                      g.kernel_h * g.kernel_w);
      data = reordered.data();
    }
  }
};

}  // namespace kiln::cpu::conv_nhwc
