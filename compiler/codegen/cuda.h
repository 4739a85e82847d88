#pragma once
// The CUDA renderer: a Kernel as one CUDA C++ translation unit for NVRTC
// (kernels/cuda/nvrtc.h), computing what render_cpp's function computes: the same
// kernels/scalar.h functions, the 16-bit floats held in f32 and rounded at the same points,
// reductions accumulating in the same dtype from the same identity.
//
// ABI of the generated kernel (one per translation unit):
//
//   struct KilnArgs { long long v[N]; };   // N = max(1, arg_layout(kernel).count)
//   extern "C" __global__ void __launch_bounds__(256)
//   k_<name>(T0* out0, ..., const Ti* in0, ..., const KilnArgs args)
//
// - the buffer pointers are typed (float, double, kiln::Half, kiln::BFloat16, long long,
//   int, unsigned char, bool), one per kernel.buffers entry in that order (outputs first);
//   each points at its tensor's storage base, the element offset being in args;
// - args is arg_layout(kernel)'s int64 array passed by value: sizes, then per buffer its
//   strides and offset, in elements;
// - launch with cuda_launch_shape(): blockDim.x = block (a multiple of 32, at most 256),
//   gridDim.x = grid, dynamic shared memory = shared_bytes (0: reductions use static
//   shared memory). Nothing to launch when grid is 0.
//
// Mapping. Pointwise: a 1-D grid-stride loop over the product of the iteration sizes, each
// linear index (64-bit) unravelled into i0..i<rank-1>. Reduction: a grid-stride loop of
// blocks over the kept (outer) indices; the block's threads stride over the reduced
// elements, each accumulating from the identity, then combine with warp shuffles and
// through shared memory (one slot per warp); thread 0 evaluates the exprs after the
// reduction and stores. The order in which a sum adds its terms differs from the C++
// target's, so float sums agree to rounding (they accumulate in f64, as there).
#include <cstdint>
#include <span>
#include <string>

#include "compiler/codegen/kernel_ir.h"

namespace kiln::compiler::codegen {

// The kernel's function name ("k_" + its name, as cpp_symbol).
std::string cuda_symbol(const Kernel& kernel);
// The complete translation unit.
std::string render_cuda(const Kernel& kernel);

struct CudaLaunch {
  int64_t grid = 0;      // blocks (0: an empty space, nothing to launch)
  int block = 256;       // threads per block
  int shared_bytes = 0;  // dynamic shared memory
};
// The launch of `kernel` for the argument array `args` (arg_layout's; its sizes decide).
// Pointwise: 256 threads, enough blocks to cover the space up to a cap (the grid-stride
// loop does the rest). Reduction: one block per kept index up to the same cap, of 32 to 256
// threads (the reduced extent rounded up to a power of two).
CudaLaunch cuda_launch_shape(const Kernel& kernel, std::span<const int64_t> args);

}  // namespace kiln::compiler::codegen
