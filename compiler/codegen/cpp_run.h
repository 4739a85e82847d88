#pragma once
// Running a compiled kernel on tensors: binds the buffers and computes the arguments.
#include <span>
#include <vector>

#include "compiler/codegen/cpp_jit.h"
#include "compiler/codegen/kernel_ir.h"
#include "core/tensor.h"

namespace kiln::compiler::codegen {

// The buffers and arguments of one call of `kernel`. `inputs` are the tensors of its input
// buffers in order (the values before their views; the views are applied here), `outputs`
// those of its output buffers; any strides. Each input's buffer is its storage at the
// tensor's own offset, and the views' offsets and strides become arguments. Shapes and
// dtypes are checked against the kernel (kiln::Error naming the buffer), and every tensor
// must be on the first output's device.
struct KernelCall {
  std::vector<void*> buffers;
  std::vector<int64_t> args;
};
// Runs of dims that every buffer walks as one are merged into one dim in the arguments;
// with `split_long_runs` (the C++ target: its OpenMP threads share the outer loops) a run
// of more than 65,536 elements keeps two dims.
KernelCall kernel_call(const Kernel& kernel, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                       bool split_long_runs = true);

// Runs `compiled` (the rendering of `kernel`) on the tensors: kernel_call, then the call.
void run_kernel(const CompiledKernel& compiled, const Kernel& kernel, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs);

}  // namespace kiln::compiler::codegen
