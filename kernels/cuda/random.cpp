// CUDA kernels of the random ops: dropout and the random factory ops uniform, normal and
// randint. Each thread computes one element from the Philox counter offset + its row-major
// index, with the functions of core/philox.h that the CPU kernels call
// (kernels/cpu/dropout.cpp, kernels/cpu/factory.cpp) and the same float arithmetic (NVRTC
// runs with --fmad=false, so no multiply-add is contracted), so the GPU's stream is the
// CPU's: dropout's mask and output, uniform and randint are equal bit for bit.
//
// normal is the exception: Box-Muller's logf/cosf (log/cos for f64) are CUDA's libdevice
// functions on the GPU and the C library's on the CPU, and those differ in the last bit or
// two for some arguments (CUDA documents logf to 1 ulp, cosf to 2 ulp; glibc rounds almost
// correctly). The uniforms fed to them are identical, so a normal sample differs from the
// CPU's by a few ulp at most, and a 16-bit one by at most one step of its dtype.
// dropout's backward is grad * mask * scale: ordinary elementwise ops.
#include "core/ops/dropout.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::f16, DType::bf16};
const std::vector<DType> kAll = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                 DType::i64, DType::i32, DType::u8,  DType::boolean};

const KernelFamily kDropout("dropout", R"(
#include "core/philox.h"
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* x, T* out, bool* mask, long long count, unsigned long long seed,
                                unsigned long long offset, float threshold, double scale) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= count) return;
  const bool kept = kiln::philox::dropout_keep(seed, offset, (unsigned long long)i, threshold);
  mask[i] = kept;
  // x * 0 rather than 0, so NaN and inf stay visible, as on the CPU.
  out[i] = T((C)x[i] * (kept ? (C)scale : C(0)));
}
)",
                            kFloats);

// digits: the random bits of a 16-bit float's uniform (11 for f16, 8 for bf16), 24 for f32.
const KernelFamily kUniform("uniform", R"(
#include "core/philox.h"
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(T* out, long long count, unsigned long long seed, unsigned long long offset,
                                double low, double high, int digits) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= count) return;
  const kiln::philox::Block b = kiln::philox::random4(seed, offset + (unsigned long long)i);
  if (sizeof(C) == 8) {
    out[i] = T(low + (high - low) * kiln::philox::uniform_f64(b));
  } else {
    const float u = digits == 24 ? kiln::philox::uniform_f32(b) : kiln::philox::uniform_digits(b, digits);
    out[i] = T((float)low + (float)(high - low) * u);
  }
}
)",
                            kFloats);

const KernelFamily kNormal("normal", R"(
#include "core/philox.h"
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(T* out, long long count, unsigned long long seed, unsigned long long offset,
                                double mean, double std) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= count) return;
  const kiln::philox::Block b = kiln::philox::random4(seed, offset + (unsigned long long)i);
  if (sizeof(C) == 8) out[i] = T(mean + std * kiln::philox::normal_f64(b));
  else out[i] = T((float)mean + (float)std * kiln::philox::normal_f32(b));
}
)",
                           kFloats);

const KernelFamily kRandint("randint", R"(
#include "core/philox.h"
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(T* out, long long count, unsigned long long seed, unsigned long long offset,
                                long long low, unsigned long long range) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= count) return;
  const kiln::philox::Block b = kiln::philox::random4(seed, offset + (unsigned long long)i);
  const long long v = low + (long long)(kiln::philox::bits64(b) % range);
  out[i] = (T)(C)v;
}
)",
                            kAll);


unsigned long long u64_attr(const Attrs& a, const char* key) { return static_cast<unsigned long long>(a.i(key)); }

void dropout(Span in, Span out, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  const Contiguous o(out[0]), mask(out[1]);
  if (!a.b("train")) {
    Tensor(out[0]).copy_(x);
    Tensor(out[1]).fill_(true);
    return;
  }
  const double p = a.f("p");
  const long long count = x.numel();
  kDropout.launch(x.dtype(), x.device().index, count, x.data_ptr(), o.ptr(), mask.ptr(), count,
                  u64_attr(a, "seed"), u64_attr(a, "offset"), static_cast<float>(p), dropout_scale(p));
  o.finish();
  mask.finish();
}

void uniform(Span, Span out, const Attrs& a) {
  const Contiguous o(out[0]);
  const DType t = out[0].dtype();
  const int digits = t == DType::f16 ? 11 : t == DType::bf16 ? 8 : 24;
  const long long count = out[0].numel();
  kUniform.launch(t, out[0].device().index, count, o.ptr(), count, u64_attr(a, "seed"), u64_attr(a, "offset"),
                  a.f("low"), a.f("high"), digits);
  o.finish();
}

void normal(Span, Span out, const Attrs& a) {
  const Contiguous o(out[0]);
  const long long count = out[0].numel();
  kNormal.launch(out[0].dtype(), out[0].device().index, count, o.ptr(), count, u64_attr(a, "seed"),
                 u64_attr(a, "offset"), a.f("mean"), a.f("std"));
  o.finish();
}

void randint(Span, Span out, const Attrs& a) {
  const Contiguous o(out[0]);
  const long long count = out[0].numel(), low = a.i("low");
  const auto range = static_cast<unsigned long long>(a.i("high") - low);
  KILN_CHECK(range > 0, "randint: high {} must exceed low {}", a.i("high"), low);
  kRandint.launch(out[0].dtype(), out[0].device().index, count, o.ptr(), count, u64_attr(a, "seed"),
                  u64_attr(a, "offset"), low, range);
  o.finish();
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("dropout", cuda, dropout);
    register_kernel("uniform", cuda, uniform);
    register_kernel("normal", cuda, normal);
    register_kernel("randint", cuda, randint);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
