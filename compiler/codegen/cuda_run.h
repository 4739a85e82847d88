#pragma once
// Compiling, loading and running CUDA renderings of kernels (codegen/cuda.h) on CUDA
// tensors: what the compiled program and the eager CUDA ops (compiler/codegen/cuda_eager.cpp) share.
// No CUDA header here: a loaded kernel is an opaque handle. In a build without the CUDA
// toolkit every function is a kiln::Error saying so.
#include <span>
#include <string>
#include <vector>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/kernel_ir.h"
#include "core/tensor.h"

namespace kiln::compiler::codegen {

// A kernel compiled by NVRTC for one architecture and loaded (a cudaKernel_t).
struct CudaFunction {
  void* handle = nullptr;
  std::string name;
  std::string arch;  // "sm_90"
};

// The architecture of CUDA device `device` ("sm_90"), asked once per device.
const std::string& cuda_arch(Device device);

// Renders, compiles (NVRTC, through the kernel cache, `jobs` at a time) and loads each
// kernel for `device`'s architecture.
std::vector<CudaFunction> load_cuda_kernels(const std::vector<const Kernel*>& kernels, Device device, int jobs = 2);

// Runs `function` (the rendering of `kernel`) on the device of outputs[0], on its current
// stream: inputs are the tensors of the kernel's input buffers in order (as run_kernel
// takes them; a one-element CPU tensor becomes a device constant first), outputs those of
// its output buffers. `tuning` (pointwise kernels only) overrides the default launch.
void run_cuda_kernel(const CudaFunction& function, const Kernel& kernel, std::span<const Tensor> inputs,
                     std::span<const Tensor> outputs, const LaunchTuning& tuning = {});

// Times pointwise kernel `function` under each candidate launch (a few block sizes and grid
// caps) on `inputs`, writing into scratch tensors shaped as `outputs`, and returns the
// fastest with its time in microseconds and the default's. Synchronizes the stream.
struct TunedLaunch {
  LaunchTuning tuning;
  double best_us = 0, default_us = 0;
};
TunedLaunch tune_cuda_launch(const CudaFunction& function, const Kernel& kernel, std::span<const Tensor> inputs,
                             std::span<const Tensor> outputs);

}  // namespace kiln::compiler::codegen
