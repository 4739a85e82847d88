// NVRTC's entry points (kernels/cuda/nvrtc.h) in a build without the CUDA toolkit, which
// renders CUDA (compiler/codegen/cuda.cpp) but cannot compile it: each says so. A build with
// CUDA compiles kernels/cuda/nvrtc.cpp instead.
#if !defined(KILN_HAVE_CUDA)
#include "core/error.h"
#include "kernels/cuda/nvrtc.h"

namespace kiln::cuda {
namespace {
[[noreturn]] void no_nvrtc() { fail("compile_cuda: this build of kiln has no CUDA backend (no NVRTC)"); }
}  // namespace
CudaBinary compile_cuda(const std::string&, const std::string&, const NvrtcOptions&) { no_nvrtc(); }
std::vector<CudaBinary> compile_cuda_batch(const std::vector<std::pair<std::string, std::string>>&,
                                           const NvrtcOptions&, int) {
  no_nvrtc();
}
int64_t nvrtc_invocations() { return 0; }
void clear_cuda_memory_cache() {}
void parse_ptxas_report(const std::string&, CudaBinary&) { no_nvrtc(); }
}  // namespace kiln::cuda
#endif
