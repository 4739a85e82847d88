#include "compiler/codegen/run.h"

#include <fmt/format.h>

namespace kiln::compiler::codegen {

KernelCall kernel_call(const Kernel& kernel, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const std::vector<int32_t> in_buffers = kernel.input_buffers(), out_buffers = kernel.output_buffers();
  KILN_CHECK(inputs.size() == in_buffers.size() && outputs.size() == out_buffers.size(),
             "run_kernel {}: expects {} inputs and {} outputs, got {} and {}", kernel.name, in_buffers.size(),
             out_buffers.size(), inputs.size(), outputs.size());
  // Each buffer's tensor as the kernel indexes it (inputs seen through their views).
  std::vector<Tensor> base(kernel.buffers.size()), viewed(kernel.buffers.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto b = static_cast<size_t>(in_buffers[i]);
    base[b] = inputs[i];
    Tensor t = inputs[i];
    for (const ViewStep& step : kernel.buffers[b].views) t = step.op->view(t, step.attrs);
    viewed[b] = t;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto b = static_cast<size_t>(out_buffers[i]);
    base[b] = viewed[b] = outputs[i];
  }

  KernelCall call;
  call.args.resize(static_cast<size_t>(arg_layout(kernel).count));
  for (int32_t d = 0; d < kernel.rank; ++d) {
    const auto [b, td] = kernel.size_from[static_cast<size_t>(d)];
    call.args[static_cast<size_t>(d)] = viewed[static_cast<size_t>(b)].size(td);
  }
  size_t next = static_cast<size_t>(kernel.rank);
  for (size_t b = 0; b < kernel.buffers.size(); ++b) {
    const Buffer& buffer = kernel.buffers[b];
    const Tensor& t = viewed[b];
    // Every buffer on the device of the first output (the CPU, or the GPU that runs it).
    const Device device = outputs.empty() ? Device::cpu() : outputs[0].device();
    KILN_CHECK(t.defined() && t.dtype() == buffer.dtype && t.device() == device,
               "run_kernel {}: buffer {} must be a defined {} {} tensor, got {}", kernel.name, buffer.name,
               buffer.dtype, device, t.defined() ? t.meta_str() : std::string("undefined"));
    // Every dim the tensor has must be walked by one iteration dim, or be a broadcast 1.
    std::vector<bool> walked(static_cast<size_t>(t.dim()), false);
    for (int32_t d = 0; d < kernel.rank; ++d) {
      const int32_t td = buffer.dim_of[static_cast<size_t>(d)];
      if (td < 0) continue;
      KILN_CHECK(td < t.dim() && t.size(td) == call.args[static_cast<size_t>(d)],
                 "run_kernel {}: buffer {} of shape {} does not fit the iteration space [{}]", kernel.name,
                 buffer.name, shape_str(t.shape()),
                 fmt::join(std::span(call.args.data(), static_cast<size_t>(kernel.rank)), ","));
      walked[static_cast<size_t>(td)] = true;
      call.args[next++] = t.stride(td);
    }
    for (int64_t td = 0; td < t.dim(); ++td)
      KILN_CHECK(walked[static_cast<size_t>(td)] || t.size(td) == 1,
                 "run_kernel {}: buffer {} of shape {} has dim {} of size {} that the kernel broadcasts",
                 kernel.name, buffer.name, shape_str(t.shape()), td, t.size(td));
    call.args[next++] = t.offset() - base[b].offset();
    call.buffers.push_back(base[b].data_ptr());
  }
  return call;
}

void run_kernel(const CompiledKernel& compiled, const Kernel& kernel, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs) {
  KILN_CHECK(compiled.function != nullptr, "run_kernel {}: the kernel is not compiled", kernel.name);
  const KernelCall call = kernel_call(kernel, inputs, outputs);
  compiled.function(call.buffers.data(), call.args.data());
}

}  // namespace kiln::compiler::codegen
