// CUDA kernels of the factory ops. empty allocates only; full fills on the GPU (the fill
// kernel is generated, compiler/codegen/cuda_eager.cpp); the random ones (uniform, normal, randint)
// are Philox kernels of their own (kernels/cuda/random.cpp); arange, linspace and eye are
// hand-written kernels computing each element as the CPU kernel does (f64 arithmetic,
// rounded through the compute type), so they give the CPU's values exactly, with no
// host-to-device copy (which a CUDA graph could not hold).
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

void empty_cuda(Span, Span, const Attrs&) {}

void full_cuda(Span, Span out, const Attrs& attrs) { Tensor(out[0]).fill_(attrs.scalar("value")); }

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                 DType::i64, DType::i32, DType::u8,  DType::boolean};

// arange: element i is start + step * i, in f64 for the floating dtypes (rounded through the
// compute type, as the CPU's compute_t), in wrapping i64 otherwise.
const KernelFamily kArange("arange", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(T* out, long long n, int floating, double start, double step, long long istart,
                                long long istep) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (floating)
    out[i] = T((C)(start + step * (double)i));
  else
    out[i] = T((long long)((unsigned long long)istart + (unsigned long long)istep * (unsigned long long)i));
}
)",
                           {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8});

// linspace: the first half counts from start, the second back from end (both ends exact).
// An integer dtype converts through i64 (as the CPU kernel), bool by v != 0.
const KernelFamily kLinspace("linspace", R"(
typedef SCALAR T;
typedef COMPUTE C;
template <class X> __device__ X from_double(double v) { return X((long long)v); }
template <> __device__ bool from_double<bool>(double v) { return v != 0.0; }
template <> __device__ float from_double<float>(double v) { return (float)v; }
template <> __device__ double from_double<double>(double v) { return v; }
extern "C" __global__ void NAME(T* out, long long n, double start, double end, double step) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const double v = i < n / 2 || n == 1 ? start + step * (double)i : end - step * (double)(n - 1 - i);
  out[i] = T(from_double<C>(v));
}
)",
                             kAll);

// eye: ones where the row equals the column of an [n, m] matrix.
const KernelFamily kEye("eye", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(T* out, long long total, long long m) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  out[i] = T((C)(i / m == i % m ? 1 : 0));
}
)",
                        kAll);

void arange_cuda(Span, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  KILN_CHECK(o.dtype() != DType::boolean, "arange: dtype bool is not supported");
  if (o.numel() == 0) return;
  const Scalar start = a.scalar("start"), step = a.scalar("step");
  const bool floating = is_floating(o.dtype());
  const Contiguous r(o);
  kArange.launch(o.dtype(), o.device().index, o.numel(), r.ptr(), static_cast<long long>(o.numel()),
                 static_cast<int>(floating), floating ? start.to_double() : 0.0, floating ? step.to_double() : 0.0,
                 static_cast<long long>(floating ? 0 : start.to_int()), static_cast<long long>(floating ? 0 : step.to_int()));
  r.finish();
}

void linspace_cuda(Span, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const double start = a.f("start"), end = a.f("end");
  const auto n = static_cast<long long>(o.numel());
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  const Contiguous r(o);
  kLinspace.launch(o.dtype(), o.device().index, n, r.ptr(), n, start, end, step);
  r.finish();
}

void eye_cuda(Span, Span out, const Attrs&) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const Contiguous r(o);
  kEye.launch(o.dtype(), o.device().index, o.numel(), r.ptr(), static_cast<long long>(o.numel()),
              static_cast<long long>(o.size(1)));
  r.finish();
}

struct Registrar {
  Registrar() {
    register_kernel("empty", DeviceType::cuda, empty_cuda);
    register_kernel("full", DeviceType::cuda, full_cuda);
    register_kernel("arange", DeviceType::cuda, arange_cuda);
    register_kernel("linspace", DeviceType::cuda, linspace_cuda);
    register_kernel("eye", DeviceType::cuda, eye_cuda);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
