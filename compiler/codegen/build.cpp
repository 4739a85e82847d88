// Building kernels for their targets (compiler/codegen/build.h).
#include "compiler/codegen/build.h"

#include <cstddef>
#include <map>
#include <utility>

#include "compiler/codegen/cpp.h"
#include "compiler/codegen/cuda.h"
#include "core/error.h"

namespace kiln::compiler::codegen {

std::vector<BuiltKernel> build_kernels(std::span<const Kernel* const> kernels, std::span<const Device> devices,
                                       int jobs) {
  KILN_CHECK(kernels.size() == devices.size(), "build_kernels: {} kernels but {} devices", kernels.size(),
             devices.size());
  std::vector<BuiltKernel> built(kernels.size());
  // Every source is rendered first, then compiled in batches: the C++ ones together, the
  // CUDA ones per GPU.
  std::vector<std::pair<std::string, std::string>> cpp_sources;
  std::vector<size_t> cpp_kernels;
  std::map<int, std::vector<size_t>> cuda_kernels;  // per GPU
  for (size_t k = 0; k < kernels.size(); ++k) {
    built[k].device = devices[k];
    if (devices[k].is_cuda()) {
      built[k].source = render_cuda(*kernels[k]);
      cuda_kernels[devices[k].index].push_back(k);
    } else {
      built[k].source = render_cpp(*kernels[k]);
      cpp_sources.emplace_back(built[k].source, cpp_symbol(*kernels[k]));
      cpp_kernels.push_back(k);
    }
  }
  const std::vector<CompiledKernel> compiled = compile_cpp_batch(cpp_sources, jobs);
  for (size_t i = 0; i < cpp_kernels.size(); ++i) built[cpp_kernels[i]].compiled = compiled[i];
  for (const auto& [device, ks] : cuda_kernels) {
    std::vector<const Kernel*> batch;
    for (size_t k : ks) batch.push_back(kernels[k]);
    const std::vector<CudaFunction> loaded = load_cuda_kernels(batch, Device::cuda(device), jobs);
    for (size_t i = 0; i < ks.size(); ++i) built[ks[i]].cuda = loaded[i];
  }
  return built;
}

}  // namespace kiln::compiler::codegen
