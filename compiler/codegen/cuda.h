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
// linear index unravelled into i0..i<rank-1> (32-bit divisions while the space fits 32
// bits). When the innermost size is a multiple of 4 and every buffer walking the innermost
// dim has stride 1 there from a 4-element-aligned start (offset, other strides, address),
// a thread takes 4 consecutive elements with one vector load or store per such buffer (16
// bytes for f32) and the body once per element: the check is made in the kernel, at run
// time, so one compiled kernel serves both cases. Reduction: a grid-stride loop of
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
// The threads a pointwise kernel's space needs for the argument array `args`: one per
// element, or one per 4 when the innermost size allows the vector path (the grid-stride
// loop covers the elements either way).
int64_t cuda_pointwise_threads(const Kernel& kernel, std::span<const int64_t> args);

// A pointwise kernel's launch as compile's max-autotune chose it by timing: threads per
// block (at most the kernels' launch bound, 256) and the most blocks (the grid-stride loop
// covers the rest). Zeros: the default launch. A pointwise kernel's results do not depend
// on its launch; reductions keep theirs (it decides their sums' order).
struct LaunchTuning {
  int block = 0;
  int64_t max_grid = 0;
  bool operator==(const LaunchTuning&) const = default;
};

// The launch of `kernel` for the argument array `args` (arg_layout's; its sizes decide),
// with `tuning` (pointwise kernels only) overriding the block size and grid cap.
// Pointwise: 256 threads, enough blocks to cover the space up to a cap (the grid-stride
// loop does the rest). Reduction: one block per kept index up to the same cap, of 32 to 256
// threads (the reduced extent rounded up to a power of two).
CudaLaunch cuda_launch_shape(const Kernel& kernel, std::span<const int64_t> args, const LaunchTuning& tuning = {});

}  // namespace kiln::compiler::codegen
