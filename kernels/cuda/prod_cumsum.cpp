// CUDA kernels of prod and cumsum, in kernels/cpu's arithmetic: each element is read in its
// compute type (f32 for the 16-bit floats) and widened to the CPU's accumulator (f64 for
// floats, wrapping 64-bit integers otherwise), and the result rounds once through the
// compute type.
// - prod: the input (in the output's dtype, as the CPU converts it) is permuted so that the
//   reduced dims come last and made contiguous; a team of threads (a power of two up to a
//   block) takes a row, each multiplying a strided part, and the team combines its partial
//   products in shared memory. Integer products wrap and so equal the CPU's exactly; float
//   products in f64 group differently from the CPU's loop, equal after rounding to f32 and
//   to about 1e-15 relative in f64.
// - cumsum: one thread per line along the dim, summing in order as the CPU does, so the
//   result equals the CPU's exactly. A single long line is one thread's sequential work.
#include <algorithm>

#include "core/ops/factory.h"
#include "core/ops/reduce.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i64, DType::i32, DType::u8,  DType::boolean};

// The CPU's accumulator of a compute type: f64 for floats, unsigned 64-bit (wrapping)
// otherwise.
constexpr const char* kAccumulator = R"(
template <class X> struct Accumulator { typedef unsigned long long type; };
template <> struct Accumulator<float> { typedef double type; };
template <> struct Accumulator<double> { typedef double type; };
)";

// x is [outputs, reduced] contiguous; a team of `team` threads takes a row.
const KernelFamily kProduct("product", std::string(kAccumulator) + R"(
typedef SCALAR T;
typedef COMPUTE C;
typedef Accumulator<C>::type A;
extern "C" __global__ void NAME(const T* x, long long outputs, long long reduced, int team, T* out) {
  __shared__ A partial[256];
  const long long o = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / team;
  const int lane = threadIdx.x % team;
  A a = A(1);
  if (o < outputs)
    for (long long r = lane; r < reduced; r += team) a *= (A)(C)x[o * reduced + r];
  partial[threadIdx.x] = a;
  __syncthreads();
  for (int step = team / 2; step > 0; step /= 2) {
    if (lane < step) partial[threadIdx.x] *= partial[threadIdx.x + step];
    __syncthreads();
  }
  if (lane == 0 && o < outputs) out[o] = T((C)partial[threadIdx.x]);
}
)",
                                  kAllDTypes);

// x and out are [outer, size, inner] contiguous; thread t sums line (t / inner, :, t % inner).
const KernelFamily kCumsum("cumsum", std::string(kAccumulator) + R"(
typedef SCALAR T;
typedef COMPUTE C;
typedef Accumulator<C>::type A;
extern "C" __global__ void NAME(const T* x, long long outer, long long size, long long inner, T* out) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= outer * inner) return;
  const long long base = (t / inner) * size * inner + t % inner;
  A a = A(0);
  for (long long k = 0; k < size; ++k) {
    a += (A)(C)x[base + k * inner];
    out[base + k * inner] = T((C)a);
  }
}
)",
                                 kAllDTypes);

long long pow2_at_least(long long n) {
  long long p = 1;
  while (p < n) p *= 2;
  return p;
}

void prod_kernel(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const long long outputs = o.numel(), reduced = in[0].numel() / outputs;
  if (reduced == 0) {  // the empty product
    Tensor(o).fill_(1);
    return;
  }
  Tensor x = in[0].to(o.dtype());
  if (x.dim() > 0) {
    // The kept dims in order, then the reduced ones: out's elements in order, each a row.
    const std::vector<bool> reduced_dim =
        reduced_dims(x.shape(), a.has("dims") ? a.ints("dims") : DimList{}, "prod");
    std::vector<int64_t> order;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t d = 0; d < x.dim(); ++d)
        if (reduced_dim[static_cast<size_t>(d)] == (pass == 1)) order.push_back(d);
    x = x.permute(order);
  }
  x = x.contiguous();
  const Contiguous result(o);
  const long long team = std::min<long long>(KernelFamily::kBlock, pow2_at_least(reduced));
  kProduct.launch(o.dtype(), o.device().index, outputs * team, x.data_ptr(), outputs, reduced,
                  static_cast<int>(team), result.ptr());
  result.finish();
}

void cumsum_kernel(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const Tensor x = in[0].to(o.dtype()).contiguous();
  long long outer = 1, size = 1, inner = 1;
  if (x.dim() > 0) {
    const int64_t dim = wrap_dim(a.i("dim"), x.dim(), "cumsum");
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    size = x.size(dim);
  }
  const Contiguous result(o);
  kCumsum.launch(o.dtype(), o.device().index, outer * inner, x.data_ptr(), outer, size, inner, result.ptr());
  result.finish();
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("prod", cuda, prod_kernel);
    register_kernel("cumsum", cuda, cumsum_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
