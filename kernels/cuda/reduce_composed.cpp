// CUDA kernels of var, std, logsumexp, all, any and norm, composed of eager CUDA ops (sum,
// mean, amax, amin and elementwise maps: generated kernels) in the arithmetic of
// kernels/cpu/reduce.cpp: var/std and the finite norms accumulate in f64 from the input's
// compute type and round once (through f32 for the 16-bit floats, as the CPU's narrow()
// does); logsumexp shifts by the max in the compute type, sums exp in f64 and adds the
// shift back in f64; the infinite norms are amax/amin of |x| in the input's dtype; all and
// any count zeros or nonzeros in i64. The sums' order differs from the CPU's, so float
// results agree to rounding, and exp, log, sqrt and pow come from CUDA's libdevice; the
// rest is exact. Several launches where one fused kernel would do: the compiler's fusion
// is the fast path; these keep eager mode on the GPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/registry.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

DimList dims_attr(const Attrs& a) { return a.has("dims") ? a.ints("dims") : DimList{}; }

// The type the CPU computes a `t` element in: f32 for the 16-bit floats.
DType compute_dtype(DType t) { return is_reduced_float(t) ? DType::f32 : t; }

// Writes `r` (reduced with keepdim) into `out` in out's dtype, through the compute type
// first, as the CPU rounds an f64 accumulator.
void store(const Tensor& r, const Tensor& out) {
  Tensor(out).copy_(r.to(compute_dtype(out.dtype())).reshape(out.shape()));
}

template <bool kRoot>
void var_std_kernel(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const double n = static_cast<double>(in[0].numel() / o.numel());
  const double divisor = std::max(0.0, n - a.f("correction"));
  if (n == 0) {  // the CPU's 0 / max(0, -correction): NaN
    Tensor(o).fill_(std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const DimList dims = dims_attr(a);
  const Tensor x = in[0].to(DType::f64);
  const Tensor deviation = x - mean(x, dims, true);
  const Tensor v = sum(deviation * deviation, dims, true) / divisor;
  store(kRoot ? sqrt(v) : v, o);
}

void logsumexp_kernel(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  if (in[0].numel() == 0) {  // log(0)
    Tensor(o).fill_(-std::numeric_limits<double>::infinity());
    return;
  }
  const DimList dims = dims_attr(a);
  const Tensor x = in[0].to(compute_dtype(o.dtype()));
  // An infinite max shifts by 0: all -inf gives log(0) = -inf, any +inf gives +inf.
  const Tensor max = amax(x, dims, true);
  const Tensor shift = where(eq(abs(max), std::numeric_limits<double>::infinity()), 0.0, max);
  const Tensor total = sum(exp(x - shift), dims, true, DType::f64);
  store(log(total) + shift.to(DType::f64), o);
}

template <bool kAll>
void all_any_kernel(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  if (in[0].numel() == 0) {  // the identity: all of nothing is true, any of nothing false
    Tensor(o).fill_(kAll ? 1 : 0);
    return;
  }
  const DimList dims = dims_attr(a);
  const Tensor r = kAll ? eq(sum(eq(in[0], 0), dims, true), 0) : gt(sum(ne(in[0], 0), dims, true), 0);
  Tensor(o).copy_(r.reshape(o.shape()));
}

void norm_kernel(Span in, Span out, const Attrs& a) {
  const double p = a.f("p");
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  if (in[0].numel() == 0) {  // the finite p >= 0 norms of nothing (the others reject it)
    Tensor(o).fill_(0);
    return;
  }
  const DimList dims = dims_attr(a);
  const Tensor& x = in[0];
  if (std::isinf(p)) {
    Tensor(o).copy_((p > 0 ? amax(abs(x), dims, true) : amin(abs(x), dims, true)).reshape(o.shape()));
    return;
  }
  if (p == 0) return store(sum(ne(x, 0), dims, true, DType::f64), o);
  if (p == 1) return store(sum(abs(x), dims, true, DType::f64), o);
  const Tensor m = abs(x).to(DType::f64);
  if (p == 2) return store(sqrt(sum(m * m, dims, true)), o);
  store(pow(sum(pow(m, p), dims, true), 1.0 / p), o);
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("var", cuda, var_std_kernel<false>);
    register_kernel("std", cuda, var_std_kernel<true>);
    register_kernel("logsumexp", cuda, logsumexp_kernel);
    register_kernel("all", cuda, all_any_kernel<true>);
    register_kernel("any", cuda, all_any_kernel<false>);
    register_kernel("norm", cuda, norm_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
