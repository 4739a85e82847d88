// kernels/scalar.h and core/philox.h are the one source of the scalar functions for
// the CPU and for generated CUDA kernels. Without a GPU we can still prove the CUDA half:
// NVRTC compiles a kernel that instantiates every function to PTX and to sm_90 machine code.
#include <catch2/catch.hpp>

#include <nvrtc.h>

#include <string>
#include <vector>

namespace {

// Every scalar function, instantiated for the types kiln computes in.
const char* kKernel = R"(
#include "kernels/scalar.h"
#include "core/philox.h"
#include "core/half.h"

namespace ks = kiln::scalar;

template <class T> __device__ T all_arith(T a, T b) {
  T r = ks::add(a, b) + ks::sub(a, b) + ks::mul(a, b) + ks::neg(a) + ks::abs(a) + ks::sign(a);
  r = r + ks::maximum(a, b) + ks::minimum(a, b) + ks::clamp(a, b, b) + ks::pow(a, b);
  r = r + ks::relu(a) + ks::where(ks::lt(a, b), a, b);
  r = r + T(ks::eq(a, b) + ks::ne(a, b) + ks::le(a, b) + ks::gt(a, b) + ks::ge(a, b));
  r = r + T(ks::logical_and(a, b) + ks::logical_or(a, b) + ks::logical_not(a));
  return r;
}

template <class T> __device__ T all_floating(T a, T b) {
  T r = all_arith(a, b) + ks::div(a, b);
  r = r + ks::exp(a) + ks::log(a) + ks::log1p(a) + ks::expm1(a) + ks::sqrt(a) + ks::rsqrt(a);
  r = r + ks::reciprocal(a) + ks::sin(a) + ks::cos(a) + ks::tanh(a) + ks::erf(a) + ks::exp_nonpositive(a);
  r = r + ks::sigmoid(a) + ks::silu(a) + ks::gelu(a, false) + ks::gelu(a, true);
  r = r + ks::gelu_backward(a, b, false) + ks::gelu_backward(a, b, true);
  r = r + ks::softplus(a, T(1), T(20));
  return r;
}

extern "C" __global__ void scalar_functions(float* f, double* d, long long* i, int* j,
                                            unsigned char* u, unsigned short* h, unsigned short* bf,
                                            unsigned long long seed) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  f[k] = all_floating(f[k], f[k + 1]);
  d[k] = all_floating(d[k], d[k + 1]);
  i[k] = all_arith(i[k], i[k + 1]) + ks::div(i[k], i[k + 1] + 1);
  j[k] = all_arith(j[k], j[k + 1]);
  u[k] = all_arith(u[k], u[k + 1]);
  // 16-bit storage, f32 arithmetic.
  const float hf = kiln::Half::from_bits(h[k]);
  h[k] = kiln::Half(all_floating(hf, hf)).bits;
  const float bff = kiln::BFloat16::from_bits(bf[k]);
  bf[k] = kiln::BFloat16(all_floating(bff, bff)).bits;
  const kiln::philox::Block b = kiln::philox::random4(seed, k);
  f[k] += kiln::philox::uniform_f32(b) + kiln::philox::normal_f32(b);
  d[k] += kiln::philox::uniform_f64(b) + kiln::philox::normal_f64(b);
  i[k] += static_cast<long long>(kiln::philox::bits64(b));
}
)";

// Compiles kKernel; returns the log, fails the test with it on error.
std::string compile(const std::vector<std::string>& options, std::string* output, bool cubin) {
  nvrtcProgram prog;
  REQUIRE(nvrtcCreateProgram(&prog, kKernel, "scalar_functions.cu", 0, nullptr, nullptr) ==
          NVRTC_SUCCESS);
  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  const nvrtcResult result = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  INFO("NVRTC log:\n" << log);
  REQUIRE(result == NVRTC_SUCCESS);
  size_t size = 0;
  if (cubin) {
    REQUIRE(nvrtcGetCUBINSize(prog, &size) == NVRTC_SUCCESS);
    output->resize(size);
    REQUIRE(nvrtcGetCUBIN(prog, output->data()) == NVRTC_SUCCESS);
  } else {
    REQUIRE(nvrtcGetPTXSize(prog, &size) == NVRTC_SUCCESS);
    output->resize(size);
    REQUIRE(nvrtcGetPTX(prog, output->data()) == NVRTC_SUCCESS);
  }
  nvrtcDestroyProgram(&prog);
  return log;
}

}  // namespace

TEST_CASE("kernels/scalar.h compiles with NVRTC to PTX and sm_90 machine code", "[nvrtc]") {
  const std::vector<std::string> base = {"-std=c++17", "-I" KILN_SOURCE_DIR,
                                         "-I" KILN_CUDA_INCLUDE_DIR};
  std::string ptx;
  auto opts = base;
  opts.push_back("--gpu-architecture=compute_90");
  compile(opts, &ptx, false);
  CHECK(ptx.find(".entry scalar_functions") != std::string::npos);

  std::string cubin;
  opts = base;
  opts.push_back("--gpu-architecture=sm_90");
  opts.push_back("--ptxas-options=-v");
  const std::string log = compile(opts, &cubin, true);
  CHECK(cubin.size() > 0);
  CHECK(cubin.compare(0, 4, "\x7f" "ELF") == 0);
  INFO(log);
  const bool no_spills =
      log.find("spill") == std::string::npos || log.find(" 0 bytes spill stores") != std::string::npos;
  CHECK(no_spills);
}
