// CPU kernels of conv2d and its gradients: im2col / col2im around the CPU GEMM. The
// columns are built a tile of output rows at a time, so they are still in cache when the
// GEMM reads them. The forward runs (image, tile) pairs on the threads, each with
// single-threaded GEMMs; the gradients run one image per thread when the batch covers the
// threads, else image after image with the GEMM using the threads. A 1x1, stride-1,
// unpadded convolution reads its input as the column matrix directly. Depthwise
// convolutions (one input channel per group) are direct loops: their GEMMs would be too
// thin to pay. Ungrouped convolutions whose activation is channels_last run NHWC
// algorithms instead (kernels/cpu/conv_nhwc.h); their outputs are written NHWC. bf16
// operands stay bf16 through im2col into the bf16 GEMM, which sums in f32; the results are
// f32, rounded once.
#include "core/ops/conv.h"

#include <omp.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cpu/conv_dnnl.h"
#include "kernels/cpu/conv_nhwc.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using namespace conv_nhwc;
using Span = std::span<const Tensor>;

// Sizes derived from a geometry: per-group channel counts, the GEMM's reduction length
// (one group's column rows) and the output plane.
struct ConvDims {
  int64_t in_per_group, out_per_group, col_rows, out_plane, in_plane;
  explicit ConvDims(const Conv2dGeometry& g)
      : in_per_group(g.in_channels / g.groups),
        out_per_group(g.out_channels / g.groups),
        col_rows(in_per_group * g.kernel_h * g.kernel_w),
        out_plane(g.out_h * g.out_w),
        in_plane(g.in_h * g.in_w) {}
  int64_t ld_weight() const { return std::max<int64_t>(1, col_rows); }
};

bool is_depthwise(const Conv2dGeometry& g) { return g.groups > 1 && g.groups == g.in_channels; }

// The output columns [first, last) whose input column out * stride + offset lies in
// [0, in_size).
std::pair<int64_t, int64_t> valid_columns(int64_t offset, int64_t stride, int64_t in_size,
                                          int64_t out_size) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = in_size - 1 - offset < 0 ? 0 : (in_size - 1 - offset) / stride + 1;
  return {std::min(first, out_size), std::clamp(last, std::min(first, out_size), out_size)};
}

// The walk im2col and col2im share, over the output rows [oh_begin, oh_end): for every
// column-matrix row (channel, kernel tap) and output row, visit(col_row, channel, out_row,
// in_row or -1 when in the padding, first and last valid output columns, input column
// offset).
template <class Visit>
void for_each_patch_row(int64_t channels, const Conv2dGeometry& g, int64_t oh_begin, int64_t oh_end,
                        Visit&& visit) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t ki = 0; ki < g.kernel_h; ++ki)
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const int64_t row = (c * g.kernel_h + ki) * g.kernel_w + kj;
        const int64_t col_offset = kj * g.dilation_w - g.pad_w;
        const auto [first, last] = valid_columns(col_offset, g.stride_w, g.in_w, g.out_w);
        for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          const bool inside = ih >= 0 && ih < g.in_h;
          visit(row, c, oh, inside ? ih : -1, first, last, col_offset);
        }
      }
}

// col [channels * kh * kw, (oh_end - oh_begin) * OW]: the patches of one image's planes
// x [channels, H, W] under the output rows [oh_begin, oh_end).
template <class T>
void im2col(const T* x, int64_t channels, const Conv2dGeometry& g, int64_t oh_begin, int64_t oh_end,
            T* col) {
  const int64_t width = (oh_end - oh_begin) * g.out_w, sw = g.stride_w;
  for_each_patch_row(channels, g, oh_begin, oh_end,
                     [&](int64_t row, int64_t c, int64_t oh, int64_t ih, int64_t first,
                         int64_t last, int64_t off) {
                       T* dst = col + row * width + (oh - oh_begin) * g.out_w;
                       if (ih < 0) {
                         std::fill(dst, dst + g.out_w, T(0));
                         return;
                       }
                       const T* src = x + (c * g.in_h + ih) * g.in_w;
                       std::fill(dst, dst + first, T(0));
                       if (sw == 1)
                         std::copy(src + first + off, src + last + off, dst + first);
                       else
                         for (int64_t ow = first; ow < last; ++ow) dst[ow] = src[ow * sw + off];
                       std::fill(dst + last, dst + g.out_w, T(0));
                     });
}

// x [channels, H, W] += the patches in col [channels * kh * kw, (oh_end - oh_begin) * OW]
// of the output rows [oh_begin, oh_end): the adjoint of im2col.
template <class T>
void col2im(const T* col, int64_t channels, const Conv2dGeometry& g, int64_t oh_begin,
            int64_t oh_end, T* x) {
  const int64_t width = (oh_end - oh_begin) * g.out_w, sw = g.stride_w;
  for_each_patch_row(channels, g, oh_begin, oh_end,
                     [&](int64_t row, int64_t c, int64_t oh, int64_t ih, int64_t first,
                         int64_t last, int64_t off) {
                       if (ih < 0) return;
                       const T* src = col + row * width + (oh - oh_begin) * g.out_w;
                       T* dst = x + (c * g.in_h + ih) * g.in_w;
                       if (sw == 1)
                         for (int64_t ow = first; ow < last; ++ow) dst[ow + off] += src[ow];
                       else
                         for (int64_t ow = first; ow < last; ++ow) dst[ow * sw + off] += src[ow];
                     });
}

// Output rows per im2col tile: a tile of about half a megabyte stays in a core's cache
// between im2col writing it and the GEMM reading it, and still gives the GEMM a few
// hundred columns (measured on the benchmark's 3x3 64->64 conv: 10-20% faster than
// whole images).
int64_t rows_per_tile(const Conv2dGeometry& g, int64_t col_rows, size_t itemsize) {
  constexpr int64_t kTileBytes = int64_t{1} << 19;
  const int64_t row_bytes = col_rows * g.groups * g.out_w * static_cast<int64_t>(itemsize);
  return std::clamp<int64_t>(kTileBytes / std::max<int64_t>(1, row_bytes), 1,
                             std::max<int64_t>(1, g.out_h));
}

// The output rows of an image, cut into tiles for im2col.
struct RowTiles {
  int64_t rows, count;
  RowTiles(const Conv2dGeometry& g, int64_t col_rows, size_t itemsize)
      : rows(rows_per_tile(g, col_rows, itemsize)), count((g.out_h + rows - 1) / rows) {}
  int64_t begin(int64_t t) const { return t * rows; }
  int64_t end(int64_t t, const Conv2dGeometry& g) const {
    return std::min(g.out_h, (t + 1) * rows);
  }
};

// Whether the images go to the threads (each GEMM on one thread) rather than each GEMM
// using the threads: when there are images enough to keep most threads busy, since
// threaded GEMMs on one image's thin tiles spend much of their time synchronizing.
bool images_on_threads(const Conv2dGeometry& g) {
  return g.batch > 1 && 2 * g.batch >= omp_get_max_threads();
}

// Runs per_image(n, scratch) for every image; scratch holds scratch_size elements, one
// buffer per thread.
template <class T, class PerImage>
void for_each_image(const Conv2dGeometry& g, int64_t scratch_size, PerImage&& per_image) {
  if (images_on_threads(g)) {
    parallel_for(g.batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> scratch(static_cast<size_t>(scratch_size));
      for (int64_t n = begin; n < end; ++n) per_image(n, scratch.data());
    });
  } else {
    std::vector<T> scratch(static_cast<size_t>(scratch_size));
    for (int64_t n = 0; n < g.batch; ++n) per_image(n, scratch.data());
  }
}

// ---- forward ----

template <class T>
void depthwise_forward(const T* x, const T* w, const T* bias, T* out, const Conv2dGeometry& g) {
  const ConvDims d(g);
  const int64_t taps = g.kernel_h * g.kernel_w;
  parallel_for(g.batch * g.out_channels, plane_grain(d.out_plane * taps),
               [&](int64_t b, int64_t e) {
                 for (int64_t idx = b; idx < e; ++idx) {
                   const int64_t n = idx / g.out_channels, o = idx % g.out_channels;
                   const int64_t c = o / d.out_per_group;
                   T* dst = out + idx * d.out_plane;
                   std::fill(dst, dst + d.out_plane, bias ? bias[o] : T(0));
                   const T* src = x + (n * g.in_channels + c) * d.in_plane;
                   for (int64_t ki = 0; ki < g.kernel_h; ++ki)
                     for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
                       const T wv = w[o * taps + ki * g.kernel_w + kj];
                       const int64_t off = kj * g.dilation_w - g.pad_w;
                       const auto [first, last] = valid_columns(off, g.stride_w, g.in_w, g.out_w);
                       for (int64_t oh = 0; oh < g.out_h; ++oh) {
                         const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
                         if (ih < 0 || ih >= g.in_h) continue;
                         const T* row = src + ih * g.in_w;
                         T* orow = dst + oh * g.out_w;
                         if (g.stride_w == 1)
                           for (int64_t ow = first; ow < last; ++ow) orow[ow] += wv * row[ow + off];
                         else
                           for (int64_t ow = first; ow < last; ++ow)
                             orow[ow] += wv * row[ow * g.stride_w + off];
                       }
                     }
                 }
               });
}

// S: the type of x and w (T, or bf16 whose products the GEMM sums in T = float); T: of the
// bias and the output. Depthwise convolutions come with S == T.
template <class S, class T>
void conv_forward(const S* x, const S* w, const T* bias, T* out, const Conv2dGeometry& g) {
  if constexpr (std::is_same_v<S, T>)
    if (is_depthwise(g)) return depthwise_forward(x, w, bias, out, g);
  const ConvDims d(g);
  const bool pointwise = is_pointwise(g);
  const RowTiles tiles(g, d.col_rows, sizeof(S));
  const int64_t scratch_size = pointwise ? 0 : d.col_rows * g.groups * tiles.rows * g.out_w;
  const int64_t tile_work = g.out_channels * d.col_rows * tiles.rows * g.out_w;
  // Tiles write disjoint output columns, so every (image, tile) is independent work with
  // one single-threaded GEMM per group.
  parallel_for(g.batch * tiles.count,
               std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, tile_work)),
               [&](int64_t begin, int64_t end) {
                 std::vector<S> scratch(static_cast<size_t>(scratch_size));
                 for (int64_t item = begin; item < end; ++item) {
                   const int64_t n = item / tiles.count, t = item % tiles.count;
                   const int64_t oh = tiles.begin(t), oh_end = tiles.end(t, g);
                   const int64_t width = (oh_end - oh) * g.out_w;
                   const S* xn = x + n * g.in_channels * d.in_plane;
                   T* on = out + n * g.out_channels * d.out_plane + oh * g.out_w;
                   // A pointwise conv's columns are the input's rows themselves.
                   const S* col = pointwise ? xn + oh * g.out_w : scratch.data();
                   const int64_t ld_col = pointwise ? d.in_plane : width;
                   if (!pointwise) im2col(xn, g.in_channels, g, oh, oh_end, scratch.data());
                   if (bias)
                     for (int64_t o = 0; o < g.out_channels; ++o)
                       std::fill(on + o * d.out_plane, on + o * d.out_plane + width, bias[o]);
                   for (int64_t grp = 0; grp < g.groups; ++grp)
                     gemm(false, false, d.out_per_group, width, d.col_rows, T(1),
                          w + grp * d.out_per_group * d.col_rows, d.ld_weight(),
                          col + grp * d.col_rows * ld_col, ld_col, bias ? T(1) : T(0),
                          on + grp * d.out_per_group * d.out_plane, d.out_plane);
                 }
               });
}

// ---- gradient with respect to the input ----

template <class T>
void depthwise_backward_input(const T* grad, const T* w, T* gin, const Conv2dGeometry& g) {
  const ConvDims d(g);
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t work = d.out_plane * taps * d.out_per_group;
  parallel_for(g.batch * g.in_channels, plane_grain(work), [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t n = idx / g.in_channels, c = idx % g.in_channels;
      T* dst = gin + idx * d.in_plane;
      std::fill(dst, dst + d.in_plane, T(0));
      for (int64_t o = c * d.out_per_group; o < (c + 1) * d.out_per_group; ++o) {
        const T* src = grad + (n * g.out_channels + o) * d.out_plane;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki)
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const T wv = w[o * taps + ki * g.kernel_w + kj];
            const int64_t off = kj * g.dilation_w - g.pad_w;
            const auto [first, last] = valid_columns(off, g.stride_w, g.in_w, g.out_w);
            for (int64_t oh = 0; oh < g.out_h; ++oh) {
              const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
              if (ih < 0 || ih >= g.in_h) continue;
              T* row = dst + ih * g.in_w;
              const T* grow = src + oh * g.out_w;
              for (int64_t ow = first; ow < last; ++ow) row[ow * g.stride_w + off] += wv * grow[ow];
            }
          }
      }
    }
  });
}

// grad and w of type S, gin (and the GEMM's column matrix) of type T, as conv_forward.
template <class S, class T>
void conv_backward_input(const S* grad, const S* w, T* gin, const Conv2dGeometry& g) {
  if constexpr (std::is_same_v<S, T>)
    if (is_depthwise(g)) return depthwise_backward_input(grad, w, gin, g);
  const ConvDims d(g);
  const bool pointwise = is_pointwise(g);
  const RowTiles tiles(g, d.col_rows, sizeof(T));
  const int64_t scratch_size = pointwise ? 0 : d.col_rows * g.groups * tiles.rows * g.out_w;
  // Tiles of output rows overlap in the input rows they scatter into: one image per thread.
  for_each_image<T>(g, scratch_size, [&](int64_t n, T* scratch) {
    T* xn = gin + n * g.in_channels * d.in_plane;
    if (!pointwise) std::fill(xn, xn + g.in_channels * d.in_plane, T(0));
    for (int64_t t = 0; t < tiles.count; ++t) {
      const int64_t oh = tiles.begin(t), oh_end = tiles.end(t, g);
      const int64_t width = (oh_end - oh) * g.out_w;
      const S* gn = grad + n * g.out_channels * d.out_plane + oh * g.out_w;
      T* col = pointwise ? xn + oh * g.out_w : scratch;
      const int64_t ld_col = pointwise ? d.in_plane : width;
      for (int64_t grp = 0; grp < g.groups; ++grp)
        gemm(true, false, d.col_rows, width, d.out_per_group, T(1),
             w + grp * d.out_per_group * d.col_rows, d.ld_weight(),
             gn + grp * d.out_per_group * d.out_plane, d.out_plane, T(0),
             col + grp * d.col_rows * ld_col, ld_col);
      if (!pointwise) col2im(col, g.in_channels, g, oh, oh_end, xn);
    }
  });
}

// ---- gradient with respect to the weight ----

template <class T>
void depthwise_backward_weight(const T* grad, const T* x, T* gw, const Conv2dGeometry& g) {
  const ConvDims d(g);
  const int64_t taps = g.kernel_h * g.kernel_w;
  parallel_for(g.out_channels, plane_grain(g.batch * d.out_plane * taps),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; ++o) {
                   const int64_t c = o / d.out_per_group;
                   for (int64_t ki = 0; ki < g.kernel_h; ++ki)
                     for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
                       const int64_t off = kj * g.dilation_w - g.pad_w;
                       const auto [first, last] = valid_columns(off, g.stride_w, g.in_w, g.out_w);
                       T acc = 0;
                       for (int64_t n = 0; n < g.batch; ++n) {
                         const T* src = x + (n * g.in_channels + c) * d.in_plane;
                         const T* gsrc = grad + (n * g.out_channels + o) * d.out_plane;
                         for (int64_t oh = 0; oh < g.out_h; ++oh) {
                           const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
                           if (ih < 0 || ih >= g.in_h) continue;
                           const T* row = src + ih * g.in_w;
                           const T* grow = gsrc + oh * g.out_w;
                           for (int64_t ow = first; ow < last; ++ow)
                             acc += grow[ow] * row[ow * g.stride_w + off];
                         }
                       }
                       gw[o * taps + ki * g.kernel_w + kj] = acc;
                     }
                 }
               });
}

// grad and x of type S, gw of type T, as conv_forward.
template <class S, class T>
void conv_backward_weight(const S* grad, const S* x, T* gw, const Conv2dGeometry& g) {
  if constexpr (std::is_same_v<S, T>)
    if (is_depthwise(g)) return depthwise_backward_weight(grad, x, gw, g);
  const ConvDims d(g);
  const bool pointwise = is_pointwise(g);
  const int64_t weight_size = g.out_channels * d.col_rows;
  const RowTiles tiles(g, d.col_rows, sizeof(S));
  // acc += grad_n [Og, tile] @ col_n^T [tile, Kg] per group, over the tiles of image n.
  auto accumulate = [&](int64_t n, S* scratch, T* acc) {
    const S* xn = x + n * g.in_channels * d.in_plane;
    for (int64_t t = 0; t < tiles.count; ++t) {
      const int64_t oh = tiles.begin(t), oh_end = tiles.end(t, g);
      const int64_t width = (oh_end - oh) * g.out_w;
      const S* col = pointwise ? xn + oh * g.out_w : scratch;
      const int64_t ld_col = pointwise ? d.in_plane : width;
      if (!pointwise) im2col(xn, g.in_channels, g, oh, oh_end, scratch);
      const S* gn = grad + n * g.out_channels * d.out_plane + oh * g.out_w;
      for (int64_t grp = 0; grp < g.groups; ++grp)
        gemm(false, true, d.out_per_group, d.col_rows, width, T(1),
             gn + grp * d.out_per_group * d.out_plane, d.out_plane, col + grp * d.col_rows * ld_col,
             ld_col, T(1), acc + grp * d.out_per_group * d.col_rows, d.ld_weight());
    }
  };
  std::fill(gw, gw + weight_size, T(0));
  const int64_t scratch_size = pointwise ? 0 : d.col_rows * g.groups * tiles.rows * g.out_w;
  if (images_on_threads(g)) {
    // The images are split into one part per thread, each summed into its own buffer; the
    // buffers are added in part order, so the result does not depend on the scheduling.
    const int64_t parts = std::min<int64_t>(g.batch, omp_get_max_threads());
    std::vector<std::vector<T>> sums(static_cast<size_t>(parts));
    parallel_for(parts, 1, [&](int64_t begin, int64_t end) {
      std::vector<S> scratch(static_cast<size_t>(scratch_size));
      for (int64_t part = begin; part < end; ++part) {
        std::vector<T>& acc = sums[part];
        acc.assign(static_cast<size_t>(weight_size), T(0));
        for (int64_t n = part * g.batch / parts; n < (part + 1) * g.batch / parts; ++n)
          accumulate(n, scratch.data(), acc.data());
      }
    });
    for (const std::vector<T>& acc : sums)
      for (int64_t i = 0; i < weight_size; ++i) gw[i] += acc[i];
  } else {
    std::vector<S> scratch(static_cast<size_t>(scratch_size));
    for (int64_t n = 0; n < g.batch; ++n) accumulate(n, scratch.data(), gw);
  }
}

// ---- kernels ----

// f64 stays f64; the other floating types compute in f32.
DType conv_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The dtype the operands go to the GEMMs in: bf16 stays bf16 (the bf16 GEMM sums in f32,
// and its columns take half the memory traffic), except in depthwise convolutions, whose
// loops compute in f32; f16 is converted to f32 once, as the f32 GEMM's fallback would be
// per tile (kernels/cpu/gemm.h).
DType operand_dtype(DType t, const Conv2dGeometry& g) {
  return t == DType::bf16 && !is_depthwise(g) ? DType::bf16 : conv_dtype(t);
}

// A contiguous copy of t in dtype c (t itself when it already is one).
Tensor dense(const Tensor& t, DType c) { return as_dtype(t, c).contiguous(); }

// Whether a call runs the NHWC algorithms: channels_last activations do (use_nhwc), and so
// do bf16 NCHW ones on planes of fewer than kBf16NhwcPlane pixels. Their NCHW GEMMs have
// as many columns as a plane has pixels (4 on ResNet-50's last stage at 64x64 inputs),
// which the bf16 GEMM's 32-column tiles mostly pad, and they pack the weight again for
// every image; the NHWC GEMMs span the batch, for a transpose of the activations to and
// from NHWC.
constexpr int64_t kBf16NhwcPlane = 256;
bool run_nhwc(const Tensor& activation, const Conv2dGeometry& g, DType s) {
  if (nhwc_activation(activation, g) || s != DType::bf16 ||
      g.out_h * g.out_w >= kBf16NhwcPlane)
    return use_nhwc(activation, g);
  return g.groups == 1 && g.batch > 0 && g.in_channels > 0 && g.out_channels > 0 && g.out_h > 0 &&
         g.out_w > 0;
}

// Calls f.template operator()<S, T>() with S the operands' type (dtype s) and T the
// outputs' (dtype c, conv_dtype of s).
template <class F>
void visit_conv_types(DType s, DType c, F&& f) {
  if (c == DType::f64)
    f.template operator()<double, double>();
  else if (s == DType::bf16)
    f.template operator()<BFloat16, float>();
  else
    f.template operator()<float, float>();
}

// The NHWC forward and backward_input: body<S, T>(activation, weight [Co, K] in `order`,
// out, order) with the activation channels_last in the operand dtype s, the weight as the
// matrix of the chosen column order (a weight laid out channels_last already is
// taps-outer), and the output channels_last in the compute dtype c.
template <class Body>
void nhwc_call(const Tensor& activation, const Tensor& weight, const Tensor& out,
               const Conv2dGeometry& g, DType s, DType c, Body&& body) {
  const bool w_nhwc = weight.is_contiguous(MemoryFormat::channels_last);
  const ColumnOrder order = column_order(g, w_nhwc);
  const Tensor a = dense_nhwc(activation, s);
  const Tensor w = w_nhwc ? dense_nhwc(weight, s) : dense(weight, s);
  into_layout(out, c, MemoryFormat::channels_last, [&](const Tensor& o) {
    visit_conv_types(s, c, [&]<class S, class T>() {
      const WeightMatrix<S> wm(w, w_nhwc, g, order);
      body.template operator()<S, T>(a.data_ptr<S>(), wm.data, o.data_ptr<T>(), order);
    });
  });
}

// Which of oneDNN and kiln's kernels runs a call (where oneDNN is the backend and has a JIT
// kernel for it). Measured per ResNet-18/50 shape, forward, backward input and backward
// weight, at the bench sizes (docs/design-notes.md, "CPU convolutions"): on NCHW
// activations oneDNN is 1.5-25x faster but for the gradients of 3-channel images' input
// and the weight gradients of 1024 or more input channels. On NHWC f32 ones (which oneDNN
// reads as they are) kiln's GEMMs win at 1x1 kernels over small planes or many channels,
// where a kernel covers the whole input (one GEMM), and
// at the weight gradients of more than 256 input channels, or 128 when strided; oneDNN the
// rest, less so on wide layers (figures at 2 threads). In bf16 oneDNN's forward and input gradients
// are 2-13x faster everywhere (AMX or AVX-512 BF16), its weight gradients only for
// kernels larger than 1x1 over at most 256 input channels.
enum class Pass : uint8_t { forward, backward_input, backward_weight };

bool prefer_dnnl(Pass pass, const Tensor& activation, const Conv2dGeometry& g) {
  if (conv_backend() != ConvBackend::automatic) return conv_backend() == ConvBackend::dnnl;
  const int64_t channels = g.in_channels / g.groups;
  const bool taps = g.kernel_h * g.kernel_w > 1;
  const bool strided = g.stride_h * g.stride_w > 1;
  const int64_t plane = g.out_h * g.out_w;
  // bf16 where kiln's GEMMs run on AMX (kernels/cpu/gemm_dnnl.h): im2col and those GEMMs
  // beat oneDNN 2.6's bf16 convolutions (1.7x over ResNet-50's at 28x28) except for
  // kernels with taps over few channels and planes of 4x4 and more.
  if (activation.dtype() == DType::bf16 && bf16_gemm_path() == Bf16GemmPath::dnnl) {
    if (!taps || plane == 1) return false;
    if (pass == Pass::forward) return channels <= 128 || (!strided && plane >= 16 && channels <= 256);
    if (pass == Pass::backward_input) return !strided && channels <= 128;
    return !strided && channels <= 128 && plane >= 64;
  }
  if (!nhwc_activation(activation, g)) {
    if (pass == Pass::backward_input) return channels >= 8;
    return pass == Pass::forward || channels < 1024;
  }
  if (activation.dtype() == DType::bf16)
    return pass != Pass::backward_weight || (taps && channels <= 256);
  // 1x1 kernels over planes of 8x8 and more read NHWC directly in oneDNN (1.1-2x kiln's
  // GEMMs); on smaller planes or wider layers the GEMMs keep them. One output pixel per
  // image (a kernel over the whole, cropped input) is one GEMM.
  if (!taps) return plane >= 64 && channels <= 512;
  if (plane == 1) return false;
  if (pass == Pass::forward) return channels <= 256;
  return pass == Pass::backward_input || (channels <= 256 && (!strided || channels < 128));
}

// in = {x, w, bias or undefined}.
void forward(const Tensor* in, const Tensor& out0, const Conv2dGeometry& g) {
  const Tensor out[] = {out0};
  const DType c = conv_dtype(in[0].dtype()), s = operand_dtype(in[0].dtype(), g);
  const bool has_bias = in[2].defined();
  if (prefer_dnnl(Pass::forward, in[0], g) && dnnl_conv2d(in[0], in[1], in[2], out[0], g)) return;
  const Tensor bias = has_bias ? dense(in[2], c) : Tensor();
  if (run_nhwc(in[0], g, s)) {
    nhwc_call(in[0], in[1], out[0], g, s, c,
              [&]<class S, class T>(const S* x, const S* w, T* o, ColumnOrder order) {
                nhwc_forward<S, T>(x, w, has_bias ? bias.data_ptr<T>() : nullptr, o, g, order);
              });
    return;
  }
  const Tensor x = dense(in[0], s), w = dense(in[1], s);
  into_contiguous(out[0], c, [&](const Tensor& o) {
    visit_conv_types(s, c, [&]<class S, class T>() {
      conv_forward<S, T>(x.data_ptr<S>(), w.data_ptr<S>(),
                         has_bias ? bias.data_ptr<T>() : nullptr, o.data_ptr<T>(), g);
    });
  });
}

// in = {grad_out, w}.
void backward_input(const Tensor* in, const Tensor& out0, const Conv2dGeometry& g) {
  const Tensor out[] = {out0};
  if (prefer_dnnl(Pass::backward_input, in[0], g) && dnnl_conv2d_backward_input(in[0], in[1], out[0], g)) return;
  const DType c = conv_dtype(in[0].dtype()), s = operand_dtype(in[0].dtype(), g);
  if (run_nhwc(in[0], g, s)) {
    nhwc_call(in[0], in[1], out[0], g, s, c,
              [&]<class S, class T>(const S* grad, const S* w, T* o, ColumnOrder order) {
                nhwc_backward_input<S, T>(grad, w, o, g, order);
              });
    return;
  }
  const Tensor grad = dense(in[0], s), w = dense(in[1], s);
  into_contiguous(out[0], c, [&](const Tensor& o) {
    visit_conv_types(s, c, [&]<class S, class T>() {
      conv_backward_input<S, T>(grad.data_ptr<S>(), w.data_ptr<S>(), o.data_ptr<T>(), g);
    });
  });
}

// The weight gradient (grad_out in[0], input in[1]) into `out`; plus in[2] when defined.
void backward_weight(const Tensor* in, const Tensor& out0, const Conv2dGeometry& g) {
  const Tensor out[] = {out0};
  const DType c = conv_dtype(in[0].dtype()), s = operand_dtype(in[0].dtype(), g);
  const Tensor added = in[2];
  // Where the sum cannot start from the added gradient, it is computed apart and added after
  // (apart from `out` too when `out` is the added gradient, written in place).
  auto add_after = [&](const Tensor& o, auto&& compute) {
    if (!added.defined()) return compute(o);
    Tensor sum = make_tensor(o.shape(), o.dtype(), o.device(), o.suggest_memory_format());
    compute(sum);
    if (!same_view(o, added)) Tensor(o).copy_(added);
    Tensor(o).add_(sum);
  };
  const bool dnnl = prefer_dnnl(Pass::backward_weight, in[1], g);
  if (dnnl && !added.defined() && dnnl_conv2d_backward_weight(in[0], in[1], out[0], g)) return;
  if (dnnl && added.defined()) {  // the sum apart, then added
    Tensor sum = make_tensor(out[0].shape(), c, out[0].device(), out[0].suggest_memory_format());
    if (dnnl_conv2d_backward_weight(in[0], in[1], sum, g)) {
      if (!same_view(out[0], added)) Tensor(out[0]).copy_(added);
      Tensor(out[0]).add_(sum);
      return;
    }
  }
  if (run_nhwc(in[1], g, s)) {
    // The sum comes out [Co, kh, kw, Ci] taps-outer (the weight's channels_last layout: a
    // target laid out so takes it directly) and [Co, Ci, kh, kw] channels-outer.
    const MemoryFormat out_format = out[0].suggest_memory_format();
    const ColumnOrder order = column_order(g, out_format == MemoryFormat::channels_last);
    const Tensor grad = dense_nhwc(in[0], s), x = dense_nhwc(in[1], s);
    into_layout(out[0], c, out_format, [&](const Tensor& o) {
      visit_conv_types(s, c, [&]<class S, class T>() {
        const bool reorder =
            order == ColumnOrder::taps_outer && !o.is_contiguous(MemoryFormat::channels_last);
        // o starts as the added gradient; then the GEMMs add into it (1x1 convolutions, and
        // weights laid out as the sum comes out), or the reordered sum is added as it is
        // written: no pass over the weight besides the ones the op makes anyway.
        if (added.defined() && !same_view(o, added)) Tensor(o).copy_(added);
        if (reorder) {
          std::vector<T> sum(static_cast<size_t>(o.numel()));
          nhwc_backward_weight<S, T>(grad.data_ptr<S>(), x.data_ptr<S>(), sum.data(), g, order,
                                     false);
          swap_inner_axes(sum.data(), o.data_ptr<T>(), g.out_channels, g.kernel_h * g.kernel_w, g.in_channels,
                          added.defined());
          return;
        }
        nhwc_backward_weight<S, T>(grad.data_ptr<S>(), x.data_ptr<S>(), o.data_ptr<T>(), g, order,
                                   added.defined());
      });
    });
    return;
  }
  const Tensor grad = dense(in[0], s), x = dense(in[1], s);
  into_contiguous(out[0], c, [&](const Tensor& o) {
    add_after(o, [&](const Tensor& dst) {
      visit_conv_types(s, c, [&]<class S, class T>() {
        conv_backward_weight<S, T>(grad.data_ptr<S>(), x.data_ptr<S>(), dst.data_ptr<T>(), g);
      });
    });
  });
}


// ---- the registered kernels: dead taps cropped, then the backend chosen ----

// A kernel's taps that read only padding, for every output pixel, multiply zeros: a 3x3
// convolution padded by 1 over a 1x1 plane (ResNet-18's last stage at 32x32 inputs) is a
// 1x1 convolution by the weight's centre, and a stride-2 one over a 2x2 plane uses only
// its last two rows and columns. The kernels run such a convolution on the live taps alone
// (the weight narrowed, the padding reduced by the taps cut before them), nine or two
// times less work; the weight gradient is zero on the cut taps. nullopt where every tap
// is live or the cut cannot keep the output size with symmetric padding.
struct LiveTaps {
  Conv2dGeometry g;  // the convolution over the live taps
  int64_t h0, w0;    // the first live tap of each axis
};

// [first, last) of the live taps along one axis.
std::pair<int64_t, int64_t> live_range(int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                                       int64_t in, int64_t out) {
  int64_t first = kernel, last = 0;
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t lo = k * dilation - pad, hi = lo + (out - 1) * stride;  // rows read over the outputs
    const int64_t first_inside = lo >= 0 ? lo : lo + (-lo + stride - 1) / stride * stride;
    if (out > 0 && first_inside <= std::min(hi, in - 1)) first = std::min(first, k), last = k + 1;
  }
  return {first, last};
}

std::optional<LiveTaps> live_taps(const Conv2dGeometry& g) {
  const auto [h0, h1] = live_range(g.kernel_h, g.stride_h, g.pad_h, g.dilation_h, g.in_h, g.out_h);
  const auto [w0, w1] = live_range(g.kernel_w, g.stride_w, g.pad_w, g.dilation_w, g.in_w, g.out_w);
  if (h0 >= h1 || w0 >= w1 || (h1 - h0 == g.kernel_h && w1 - w0 == g.kernel_w)) return std::nullopt;
  LiveTaps t{g, h0, w0};
  t.g.kernel_h = h1 - h0, t.g.kernel_w = w1 - w0;
  t.g.pad_h = g.pad_h - h0 * g.dilation_h, t.g.pad_w = g.pad_w - w0 * g.dilation_w;
  auto out_size = [](int64_t in, int64_t pad, int64_t kernel, int64_t dilation, int64_t stride) {
    return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
  };
  if (t.g.pad_h < 0 || t.g.pad_w < 0 ||
      out_size(g.in_h, t.g.pad_h, t.g.kernel_h, g.dilation_h, g.stride_h) != g.out_h ||
      out_size(g.in_w, t.g.pad_w, t.g.kernel_w, g.dilation_w, g.stride_w) != g.out_w)
    return std::nullopt;
  return t;
}

Tensor live_part(const Tensor& weight, const LiveTaps& t) {
  return weight.narrow(2, t.h0, t.g.kernel_h).narrow(3, t.w0, t.g.kernel_w);
}

void conv2d_kernel(Span in, Span out, const Attrs& attrs) {
  const Conv2dGeometry g = conv2d_geometry(in[0].shape(), in[1].shape(), attrs, "conv2d");
  const Tensor bias = in.size() == 3 ? in[2] : Tensor();
  if (const auto t = live_taps(g)) {
    const Tensor args[] = {in[0], live_part(in[1], *t), bias};
    return forward(args, out[0], t->g);
  }
  const Tensor args[] = {in[0], in[1], bias};
  forward(args, out[0], g);
}

void conv2d_backward_input_kernel(Span in, Span out, const Attrs& attrs) {
  const Conv2dGeometry g =
      conv2d_geometry(attrs.ints("input_size"), in[1].shape(), attrs, "conv2d_backward_input");
  if (const auto t = live_taps(g)) {
    const Tensor args[] = {in[0], live_part(in[1], *t)};
    return backward_input(args, out[0], t->g);
  }
  backward_input(in.data(), out[0], g);
}

void conv2d_backward_weight_kernel(Span in, Span out, const Attrs& attrs) {
  const Conv2dGeometry g =
      conv2d_geometry(in[1].shape(), attrs.ints("weight_size"), attrs, "conv2d_backward_weight");
  const Tensor added = in.size() == 3 ? in[2] : Tensor();
  if (const auto t = live_taps(g)) {
    // The cut taps keep the added gradient (or zero); the live ones get it plus the sum.
    if (!added.defined())
      Tensor(out[0]).zero_();
    else if (!same_view(out[0], added))
      Tensor(out[0]).copy_(added);
    const Tensor live = live_part(out[0], *t);
    const Tensor args[] = {in[0], in[1], added.defined() ? live : Tensor()};
    return backward_weight(args, live, t->g);
  }
  const Tensor args[] = {in[0], in[1], added};
  backward_weight(args, out[0], g);
}

struct Registrar {
  Registrar() {
    register_kernel("conv2d", DeviceType::cpu, conv2d_kernel);
    register_kernel("conv2d_backward_input", DeviceType::cpu, conv2d_backward_input_kernel);
    register_kernel("conv2d_backward_weight", DeviceType::cpu, conv2d_backward_weight_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
