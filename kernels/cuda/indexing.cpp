// CUDA kernel of gather, with kernels/cpu/indexing.cpp's semantics: out has the index's
// shape, and out[c] = x[c with c[dim] replaced by index[c]]. Elements are copied as
// unsigned integers of their size (bit for bit, NaN payloads included), so one kernel per
// element size serves every dtype. The input may be strided; the index is made contiguous.
//
// Unlike the CPU kernel, an index out of [0, x.size(dim)) raises no error (finding it would
// make every call wait for the GPU): its output element is zero bits.
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr int kMaxDims = 8;

// The index's sizes and x's element strides, passed by value.
struct GatherDims {
  long long size[kMaxDims];
  long long x_stride[kMaxDims];
};

// SCALAR is an integer type of the element's size: u8, f16 (kiln::Half, a 2-byte struct),
// i32, i64.
const KernelFamily kGather("gather", R"(
typedef SCALAR T;
struct GatherDims {
  long long size[8];
  long long x_stride[8];
};
extern "C" __global__ void NAME(const T* x, const long long* index, T* out, long long total, int ndim, int dim,
                                long long dim_size, GatherDims dims) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long k = index[j];
  if (k < 0 || k >= dim_size) {
    out[j] = T{};
    return;
  }
  long long rest = j, offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const long long c = rest % dims.size[d];
    rest /= dims.size[d];
    offset += (d == dim ? k : c) * dims.x_stride[d];
  }
  out[j] = x[offset];
}
)",
                            {DType::u8, DType::f16, DType::i32, DType::i64});

DType by_size(size_t bytes) {
  switch (bytes) {
    case 1: return DType::u8;
    case 2: return DType::f16;
    case 4: return DType::i32;
    default: return DType::i64;
  }
}

// A 0-d tensor as a 1-d tensor of one element, as the CPU kernel sees it.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

void gather(Span in, Span out, const Attrs& a) {
  constexpr const char* op = "gather";
  const Tensor x = at_least_1d(in[0]);
  const Tensor index = at_least_1d(in[1]).contiguous();
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), op);
  if (out[0].numel() == 0) return;
  KILN_CHECK(x.dim() <= kMaxDims, "{}: on CUDA at most {} dims are supported, got {} and {}", op, kMaxDims,
             x.meta_str(), index.meta_str());
  GatherDims dims{};
  for (int64_t d = 0; d < x.dim(); ++d) {
    dims.size[d] = index.size(d);
    dims.x_stride[d] = x.stride(d);
  }
  const Tensor o = out[0].is_contiguous() ? out[0] : empty(out[0].shape(), {.dtype = out[0].dtype(), .device = out[0].device()});
  const long long total = o.numel(), dim_size = x.size(dim);
  kGather.launch(by_size(x.itemsize()), x.device().index, total, x.data_ptr(), index.data_ptr(), o.data_ptr(), total,
                 static_cast<int>(x.dim()), static_cast<int>(dim), dim_size, dims);
  if (!o.same(out[0])) Tensor(out[0]).copy_(o);
}

struct Registrar {
  Registrar() { register_kernel("gather", DeviceType::cuda, gather); }
} registrar;

}  // namespace
}  // namespace kiln::cuda
