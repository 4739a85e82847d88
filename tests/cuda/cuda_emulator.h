#pragma once
// The CUDA renderer's kernels run on the CPU, for machines without a GPU: render_cuda's
// translation unit is compiled by the host compiler (through the C++ JIT) after a prelude
// that gives it what CUDA would (threadIdx, blockIdx, blockDim, gridDim, __shared__,
// __syncthreads, __shfl_down_sync, the bit casts), and a launcher that runs the grid.
//
// - Kernels that never synchronize their threads run one emulated thread after another on
//   the calling thread, last first: they share nothing between threads, so any order is
//   one the GPU may choose.
// - Kernels that do (__syncthreads, warp shuffles) run a block's threads as real threads,
//   blocks one after another, with a barrier for __syncthreads and one per warp for the
//   shuffles: small grids only, whole warps only.
// - Not like a GPU: __shared__ arrays are statics, so they keep the last block's values
//   where a GPU would give garbage; a shuffle with lanes that do not arrive deadlocks.
//
// The scalar functions are kernels/scalar.h's host versions, so what this checks is the
// renderer's own code: the mapping of threads to elements, the unravelling, the vector
// path and its run-time conditions, the launch shapes and the block's combination of a
// reduction. Its results are compared with the C++ renderer's kernels.
#include <span>
#include <string>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/cpp_jit.h"
#include "compiler/codegen/kernel_ir.h"
#include "core/tensor.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::testing {

// A CUDA source compiled for the emulator, with its kernel `name` ready to launch.
// block_threads: the source synchronizes its threads (__syncthreads, shuffles), so each
// block runs as real threads.
struct EmulatedSource {
  compiler::codegen::CompiledKernel compiled;
  bool block_threads = false;
};
EmulatedSource emulate_source(const std::string& source, const std::string& name);
// Launches it: `params` as cudaLaunchKernel takes them (params[i] points at argument i).
// Returns the vector groups counted (renderer kernels only; 0 otherwise).
int64_t run_source(const EmulatedSource& e, long long grid, int block, void** params);

struct EmulatedKernel {
  const compiler::codegen::Kernel* kernel = nullptr;
  EmulatedSource source;
};

// Compiles kernel's CUDA rendering for the emulator (the kernel must outlive the result).
EmulatedKernel emulate_cuda(const compiler::codegen::Kernel& kernel);

// Runs it on CPU tensors as run_cuda_kernel would on the GPU: the same arguments (runs of
// dims merged, never split) and the launch cuda_launch_shape gives for them and `tuning`.
// Returns how many groups of elements the pointwise vector path took (0: one element per
// thread throughout).
int64_t run_emulated(const EmulatedKernel& k, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                     const compiler::codegen::LaunchTuning& tuning = {});

// While one lives, every hand-written kernel family's launch (kernels/cuda/hand_kernels.h)
// runs in the emulator: an op's CUDA kernel function, called on CPU tensors, computes on
// their memory. Ops whose CUDA kernels call the runtime, cuDNN or cuBLAS, or the generated
// kernels, still need a GPU.
class EmulatedHandKernels {
 public:
  EmulatedHandKernels();
  ~EmulatedHandKernels();
  EmulatedHandKernels(const EmulatedHandKernels&) = delete;
  EmulatedHandKernels& operator=(const EmulatedHandKernels&) = delete;
  // How many family launches the emulator has run in this process (a CUDA kernel function
  // that computes through eager ops on CPU tensors launches none: its test would compare
  // the CPU with itself).
  static int64_t launches();

 private:
  cuda::KernelLaunchHook previous_;
};

}  // namespace kiln::testing
