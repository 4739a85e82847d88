#pragma once
// 2-d convolution over NCHW tensors (cross-correlation, as in PyTorch) and its two
// gradients. Floating dtypes only; f16 and bf16 are computed in f32 and rounded once.
#include <array>
#include <cstdint>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln {

// How a convolution walks its input: `conv2d(x, w, b, {.stride = {2, 2}, .padding = {1, 1}})`.
struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};  // zeros on each side
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// input [N, C, H, W], weight [O, C / groups, kh, kw], bias [O] or undefined; gives
// [N, O, OH, OW] with OH = (H + 2 * pad - dilation * (kh - 1) - 1) / stride + 1.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& options = {});
// The gradient of conv2d with respect to its input (of shape `input_shape`).
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& options = {});
// The gradient of conv2d with respect to its weight (of shape `weight_shape`); given
// `accumulate` (of that shape), accumulate plus the gradient, summed by the kernel itself
// (what the compiler makes of `grad += g`; agrees with the add to rounding).
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& input,
                              const Shape& weight_shape, const Conv2dOptions& options = {},
                              const Tensor& accumulate = {});

// Everything a conv2d kernel needs to know about one call, read from the input and weight
// shapes and the attributes (stride, padding, dilation: 2 ints each; groups), validated.
// Errors name `op` and show both shapes.
struct Conv2dGeometry {
  int64_t batch, in_channels, in_h, in_w;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  int64_t out_h, out_w;
  Shape input_shape() const { return {batch, in_channels, in_h, in_w}; }
  Shape weight_shape() const { return {out_channels, in_channels / groups, kernel_h, kernel_w}; }
  Shape output_shape() const { return {batch, out_channels, out_h, out_w}; }
};
Conv2dGeometry conv2d_geometry(const Shape& input, const Shape& weight, const Attrs& attrs,
                               const char* op);

}  // namespace kiln
