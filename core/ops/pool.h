#pragma once
// 2-d pooling over the last two dims of NCHW (or unbatched CHW) tensors, with PyTorch's
// window arithmetic, and the ops that give their gradients. Sizes are 1 or 2 ints (one int
// stands for both dims).
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class Attrs;

struct MaxPool2dResult {
  Tensor values;
  Tensor indices;  // i64: the flat index of each maximum within its input's H*W plane
};

// Max over each window; `stride` empty means the kernel size.
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                  std::vector<int64_t> dilation = {1}, bool ceil_mode = false);
// As max_pool2d, also giving where each maximum came from.
MaxPool2dResult max_pool2d_with_indices(const Tensor& x, std::vector<int64_t> kernel_size,
                                        std::vector<int64_t> stride = {},
                                        std::vector<int64_t> padding = {0},
                                        std::vector<int64_t> dilation = {1},
                                        bool ceil_mode = false);
// The gradients of the pooling ops below are laid out as grad_out, or channels_last when
// `format` says so (autograd passes the forward input's layout: a global pool's
// [N, C, 1, 1] grad_out counts as contiguous whatever the input was).

// The gradient of max_pool2d: grad_out scattered (summed) to `indices` in a tensor shaped
// `input_size` (the forward input's full shape).
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, Shape input_size,
                           MemoryFormat format = MemoryFormat::contiguous);

// Mean over each window; `divisor_override` replaces the window size as the divisor.
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                  bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = std::nullopt);
// The gradient of avg_pool2d for an input of shape `input_size`.
Tensor avg_pool2d_backward(const Tensor& grad_out, Shape input_size,
                           std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                           std::vector<int64_t> padding = {0}, bool ceil_mode = false,
                           bool count_include_pad = true,
                           std::optional<int64_t> divisor_override = std::nullopt,
                           MemoryFormat format = MemoryFormat::contiguous);

// Mean over windows [floor(i*H/oh), ceil((i+1)*H/oh)) that give an output of `output_size`.
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size);
// The gradient of adaptive_avg_pool2d for an input of shape `input_size`.
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, Shape input_size,
                                    MemoryFormat format = MemoryFormat::contiguous);

// ---- the window arithmetic, shared by shape rules and kernels of every device ----

// A pooling op's attributes made explicit for both dims ({h, w}).
struct Pool2dParams {
  int64_t kernel[2];
  int64_t stride[2];
  int64_t padding[2];
  int64_t dilation[2];
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d only
  int64_t divisor = 0;            // avg_pool2d's divisor_override; 0 when none
};

// Reads and validates the attributes of a max_pool2d/avg_pool2d call; errors name `op`.
Pool2dParams pool2d_params(const Attrs& attrs, const char* op);
// PyTorch's pooled size of one dim (a last window must start inside the input or its
// left padding).
int64_t pooled_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                    bool ceil_mode);
// The input window [start, end) of adaptive pooling's output position i.
inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

}  // namespace kiln
