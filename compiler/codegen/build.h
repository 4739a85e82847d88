#pragma once
// Building kernels for their targets: each kernel rendered for the device its outputs live
// on (C++ for the CPU, codegen/cpp.h; CUDA for a GPU, codegen/cuda.h) and compiled, the
// C++ ones in one parallel batch through the kernel cache (codegen/cpp_jit.h), the CUDA ones
// per GPU through NVRTC (codegen/cuda_run.h). What the compiled program runs.
#include <span>
#include <string>
#include <vector>

#include "compiler/codegen/cuda_run.h"
#include "compiler/codegen/cpp_jit.h"
#include "compiler/codegen/kernel_ir.h"
#include "core/device.h"

namespace kiln::compiler::codegen {

// One kernel built for one target.
struct BuiltKernel {
  Device device;         // where it runs: the CPU (C++ target) or a GPU (CUDA target)
  std::string source;    // the rendering for that target
  CompiledKernel compiled;  // C++ target
  CudaFunction cuda;        // CUDA target
};

// Builds kernels[i] for devices[i] (the two spans have one length). kiln::Error when the
// host compiler or NVRTC fails on a kernel. `jobs`: compiler processes at once.
std::vector<BuiltKernel> build_kernels(std::span<const Kernel* const> kernels, std::span<const Device> devices,
                                       int jobs = 2);

}  // namespace kiln::compiler::codegen
