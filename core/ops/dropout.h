#pragma once
// Dropout. The op "dropout" (input x; attributes p, train, seed, offset) returns (out, mask)
// and is a pure function of its attributes. Its random rule, which every device's kernel
// follows exactly:
//
//   for the element at row-major (logical) position i of x, whatever x's strides,
//     keep_i = philox::dropout_keep(seed, offset, i, float(p))  // core/philox.h:
//              uniform_f32(random4(seed, offset + i)) >= p, compared in float
//     mask_i = keep_i                                                    // bool
//     out_i  = x_i * (keep_i ? scale : 0)  in x's compute type (f32 for f16/bf16), where
//     scale  = dropout_scale(p) = p < 1 ? 1 / (1 - p) : 0, computed in double
//
// so p == 0 keeps everything and p == 1 drops everything (a dropped NaN stays NaN, as in
// PyTorch, which multiplies by the mask). With train = false the op
// returns a copy of x and an all-true mask (the public functions skip the op entirely).
// dropout_backward is ordinary ops (grad * mask * scale), not an op of its own.
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace kiln {

// The scale kept elements are multiplied by: 1 / (1 - p), or 0 when p == 1.
inline double dropout_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

// Zeroes each element of x with probability p and scales the rest by 1 / (1 - p), drawing
// x.numel() counters from `generator` (the default one when null). train = false returns x.
Tensor dropout(const Tensor& x, double p, bool train = true, Generator* generator = nullptr);
// As dropout, also returning the bool mask of kept elements (all true when train = false).
std::pair<Tensor, Tensor> dropout_with_mask(const Tensor& x, double p, bool train = true,
                                            Generator* generator = nullptr);
// The gradient of dropout: grad * mask * dropout_scale(p), in grad's dtype.
Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double p);

}  // namespace kiln
