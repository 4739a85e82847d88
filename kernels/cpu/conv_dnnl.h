#pragma once
// conv2d and its two gradients through oneDNN (Debian's libdnnl), where the build found it.
// oneDNN's JIT convolutions work in blocked layouts (nChw16c on AVX-512, nChw8c on AVX2),
// so a call on NCHW tensors reorders the activation and weight in and the result out, as
// PyTorch's eager convolutions do; NHWC activations go in as they are where oneDNN has an
// NHWC kernel (AVX-512; not for forwards on planes under 4x4, where it is slower), and
// only the weight is reordered. On the small planes with many channels of ResNets at 32x32
// they are 2-4x faster than kiln's im2col + GEMM (docs/design-notes.md, "CPU
// convolutions"). Each function returns false, having done
// nothing, where oneDNN has no JIT implementation for the call (f16 and f64, a CPU
// without AVX2, ...) or the backend is kiln's own, and the caller runs kiln's kernels.
#include <cstdint>

#include "core/ops/conv.h"
#include "core/tensor.h"

namespace kiln::cpu {

// Who runs CPU convolutions. automatic (the default where oneDNN is built in): per call,
// whichever of oneDNN and kiln's kernels measured faster for its kind of shape and layout
// (kernels/cpu/conv.cpp, prefer_dnnl); dnnl: oneDNN wherever it has a JIT kernel; own:
// always kiln's kernels. KILN_CONV_BACKEND=auto|dnnl|own in the environment sets the start.
enum class ConvBackend : uint8_t { automatic, dnnl, own };

// Selects the backend from now on (for every thread); automatic or dnnl in a build without
// oneDNN is a kiln::Error.
void set_conv_backend(ConvBackend backend);
ConvBackend conv_backend();
// Whether this build has oneDNN.
bool conv_dnnl_available();

// out = conv2d(x, w) + bias (bias undefined for none), in out's dtype and layout.
bool dnnl_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                 const Conv2dGeometry& g);
// out = the gradient of the input from the output's gradient `grad` and the weight.
bool dnnl_conv2d_backward_input(const Tensor& grad, const Tensor& w, const Tensor& out,
                                const Conv2dGeometry& g);
// out = the gradient of the weight from the output's gradient `grad` and the input x.
bool dnnl_conv2d_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& out,
                                 const Conv2dGeometry& g);

// The implementation oneDNN picked for the last call of this thread that it ran
// ("jit:avx512_core", ...), for tests and kiln-bench; "" when none has run.
const char* dnnl_last_implementation();
// How many calls of this thread oneDNN has run.
int64_t dnnl_calls();

}  // namespace kiln::cpu
