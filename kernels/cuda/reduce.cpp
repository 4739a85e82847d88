// CUDA kernels of argmax, argmin, and max and min (along a dim: values and indices; over
// the whole tensor: the value), with kernels/cpu/reduce.cpp's answer exactly: the first NaN if there is one, else the first position of the extreme
// value, compared in the compute type (f32 for the 16-bit floats).
//
// That answer is the least (value, index) pair in an order (a NaN first, then the larger
// value for max and the smaller for min, then the lower index), so partial answers combine
// in any grouping: threads scan strided parts of a row, a block's threads combine in shared
// memory, and a long row with few outputs is split over blocks whose answers a second
// launch combines.
#include <algorithm>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

// Reduces x seen as [outer, R, inner] along R, in `splits` slices per output: task t is
// output t / splits, slice t % splits, and writes values[t] (when given) and indices[t]. A
// team of `team` threads (a power of two up to the block) shares a task. The index of the
// element at r is x_index's element there when given (the second pass), else r.
const KernelFamily kArgReduce("arg_reduce", R"(
typedef SCALAR T;
typedef COMPUTE C;

// Whether (v, i) comes before (w, j); a negative index is no candidate.
__device__ bool before(C v, long long i, C w, long long j, int is_max) {
  if (i < 0) return false;
  if (j < 0) return true;
  const bool v_nan = v != v, w_nan = w != w;
  if (v_nan != w_nan) return v_nan;
  if (v_nan || v == w) return i < j;
  return is_max ? v > w : v < w;
}

extern "C" __global__ void NAME(const T* x, const long long* x_index, long long outputs, long long reduced,
                                long long inner, long long splits, int team, int is_max, T* values,
                                long long* indices) {
  __shared__ C best_value[256];
  __shared__ long long best_index[256];
  const long long task = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / team;
  const int lane = threadIdx.x % team;
  C v = C(0);
  long long vi = -1;
  if (task < outputs * splits) {
    const long long o = task / splits, s = task % splits;
    const long long length = (reduced + splits - 1) / splits;
    const long long end = min(reduced, (s + 1) * length);
    const long long base = (o / inner) * reduced * inner + o % inner;
    for (long long r = s * length + lane; r < end; r += team) {
      const C c = (C)x[base + r * inner];
      const long long ci = x_index ? x_index[base + r * inner] : r;
      if (before(c, ci, v, vi, is_max)) {
        v = c;
        vi = ci;
      }
    }
  }
  best_value[threadIdx.x] = v;
  best_index[threadIdx.x] = vi;
  __syncthreads();
  for (int step = team / 2; step > 0; step /= 2) {
    const int other = threadIdx.x + step;
    if (lane < step && before(best_value[other], best_index[other], best_value[threadIdx.x],
                              best_index[threadIdx.x], is_max)) {
      best_value[threadIdx.x] = best_value[other];
      best_index[threadIdx.x] = best_index[other];
    }
    __syncthreads();
  }
  if (lane == 0 && task < outputs * splits) {
    if (values) values[task] = T(best_value[threadIdx.x]);
    indices[task] = best_index[threadIdx.x];
  }
}
)",
                                {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32,
                                 DType::u8, DType::boolean});

long long pow2_at_least(long long n) {
  long long p = 1;
  while (p < n) p *= 2;
  return p;
}

// The first extreme of x along `dim` (every element when has_dim is false): indices into
// `indices`, and values into `values` when it is defined.
void arg_extreme(const Tensor& input, bool has_dim, int64_t dim, bool is_max, const Tensor& values,
                 const Tensor& indices, const char* op) {
  const Tensor x = input.contiguous();
  long long outer = 1, reduced = x.numel(), inner = 1;
  if (has_dim && x.dim() > 0) {
    const int64_t d = wrap_dim(dim, x.dim(), op);
    outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
    for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
    reduced = x.size(d);
  }
  const long long outputs = outer * inner;
  if (outputs == 0) return;
  KILN_CHECK(reduced > 0, "{}: cannot reduce over no elements ({})", op, x.meta_str());
  const int device = x.device().index;
  const DType t = x.dtype();
  const int maximum = is_max ? 1 : 0;
  auto target = [](const Tensor& out) {
    return out.is_contiguous() ? out : empty(out.shape(), {.dtype = out.dtype(), .device = out.device()});
  };
  const Tensor v = values.defined() ? target(values) : Tensor(), i = target(indices);
  void* v_ptr = v.defined() ? v.data_ptr() : nullptr;
  const void* no_index = nullptr;

  // Rows along a contiguous dim get a team of threads; rows along a strided dim get one
  // thread each, so that neighbouring threads read neighbouring elements.
  const long long team = inner == 1 ? std::min<long long>(256, pow2_at_least(reduced)) : 1;
  // Few outputs over long rows: split each row so that about 2^17 threads run, each still
  // scanning 32 elements or more.
  constexpr long long kThreads = 1 << 17;
  const long long splits =
      std::clamp<long long>(kThreads / (outputs * team), 1, std::max<long long>(1, reduced / (team * 32)));
  if (splits == 1) {
    kArgReduce.launch(t, device, outputs * team, x.data_ptr(), no_index, outputs, reduced, inner, 1LL,
                      static_cast<int>(team), maximum, v_ptr, i.data_ptr());
  } else {
    const Tensor partial_values = empty({outputs, splits}, {.dtype = t, .device = x.device()});
    const Tensor partial_indices = empty({outputs, splits}, {.dtype = DType::i64, .device = x.device()});
    kArgReduce.launch(t, device, outputs * splits * team, x.data_ptr(), no_index, outputs, reduced, inner, splits,
                      static_cast<int>(team), maximum, partial_values.data_ptr(), partial_indices.data_ptr());
    const long long team2 = std::min<long long>(256, pow2_at_least(splits));
    const void* partial_index_ptr = partial_indices.data_ptr();
    kArgReduce.launch(t, device, outputs * team2, partial_values.data_ptr(), partial_index_ptr, outputs, splits,
                      1LL, 1LL, static_cast<int>(team2), maximum, v_ptr, i.data_ptr());
  }
  if (v.defined() && !v.same(values)) Tensor(values).copy_(v);
  if (!i.same(indices)) Tensor(indices).copy_(i);
}

template <bool is_max>
void arg_kernel(Span in, Span out, const Attrs& a) {
  const bool has_dim = a.has("dim");
  arg_extreme(in[0], has_dim, has_dim ? a.i("dim") : 0, is_max, Tensor(), out[0], is_max ? "argmax" : "argmin");
}

template <bool is_max>
void max_min_kernel(Span in, Span out, const Attrs& a) {
  const char* op = is_max ? "max" : "min";
  if (!a.has("dim")) {
    // The whole tensor's extreme: the value at the first extreme position (NaN when there is
    // one, as the CPU's NaN-propagating fold gives).
    const Tensor index = empty({}, {.dtype = DType::i64, .device = in[0].device()});
    arg_extreme(in[0], false, 0, is_max, out[0], index, op);
    return;
  }
  arg_extreme(in[0], true, a.i("dim"), is_max, out[0], out[1], op);
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("argmax", cuda, arg_kernel<true>);
    register_kernel("argmin", cuda, arg_kernel<false>);
    register_kernel("max", cuda, max_min_kernel<true>);
    register_kernel("min", cuda, max_min_kernel<false>);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
