// CUDA kernels of softmax, log_softmax and their backward ops, composed of eager CUDA ops
// (max, exp, sum: generated kernels). The 16-bit floats compute in f32 and round once, as
// the CPU kernels do. Five kernel launches where one fused kernel would do: the compiler's
// fusion is the fast path; these keep eager mode correct.
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/registry.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

Tensor in_compute_dtype(const Tensor& t) { return is_reduced_float(t.dtype()) ? t.to(DType::f32) : t; }

template <bool kLog>
void softmax_forward(Span in, Span out, const Attrs& attrs) {
  const Tensor x = in_compute_dtype(in[0]);
  const DimList dim = {wrap_dim(attrs.i("dim"), x.dim(), kLog ? "log_softmax" : "softmax")};
  if (x.numel() == 0) return;
  const Tensor shifted = x - amax(x, dim, true);
  const Tensor e = exp(shifted);
  Tensor(out[0]).copy_(kLog ? shifted - log(sum(e, dim, true)) : e / sum(e, dim, true));
}

template <bool kLog>
void softmax_backward(Span in, Span out, const Attrs& attrs) {
  const DType t = out[0].dtype();
  const Tensor g = in_compute_dtype(in[0].to(t)), y = in_compute_dtype(in[1].to(t));
  const DimList dim = {wrap_dim(attrs.i("dim"), g.dim(), kLog ? "log_softmax_backward" : "softmax_backward")};
  if (g.numel() == 0) return;
  Tensor(out[0]).copy_(kLog ? g - exp(y) * sum(g, dim, true) : y * (g - sum(g * y, dim, true)));
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("softmax", cuda, softmax_forward<false>);
    register_kernel("log_softmax", cuda, softmax_forward<true>);
    register_kernel("softmax_backward", cuda, softmax_backward<false>);
    register_kernel("log_softmax_backward", cuda, softmax_backward<true>);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
