#include "compiler/codegen/cpp_run.h"

#include <fmt/format.h>

namespace kiln::compiler::codegen {

namespace {

// Merges runs of iteration dims that every buffer walks as one (a contiguous [64,128,3,3]
// weight is one dim of 73,728 elements), in the argument array alone: a run [a..b] is
// walked at position b with the product of its sizes, and positions a..b-1 get size 1,
// so the compiled kernel (whose rank and broadcast pattern are fixed) runs unchanged with
// long inner loops instead of loops of 3 or 1 elements. A merged run larger than 65,536
// is split back in two at a dim boundary (outer part at b-1), which keeps an outer loop
// for the OpenMP threads (`split`; a CUDA kernel walks one linear index and wants the
// whole run). Kept and reduced dims are never merged with each other.
void coalesce(const Kernel& kernel, std::vector<int64_t>& args, bool split_long_runs) {
  const int32_t rank = kernel.rank;
  if (rank < 2) return;
  const ArgLayout layout = arg_layout(kernel);
  const size_t nb = kernel.buffers.size();
  // The argument index of buffer b's stride for dim d (-1 where it broadcasts).
  std::vector<std::vector<int32_t>> at(nb, std::vector<int32_t>(static_cast<size_t>(rank), -1));
  for (size_t b = 0; b < nb; ++b) {
    int32_t next = layout.stride_base[b];
    for (int32_t d = 0; d < rank; ++d)
      if (!kernel.buffers[b].broadcasts(d)) at[b][static_cast<size_t>(d)] = next++;
  }
  auto size = [&](int32_t d) { return args[static_cast<size_t>(d)]; };
  auto stride = [&](size_t b, int32_t d) { return args[static_cast<size_t>(at[b][static_cast<size_t>(d)])]; };
  const int32_t kept = rank - kernel.num_reduced;
  for (auto [begin, end] : {std::pair{0, kept}, std::pair{kept, rank}}) {
    int32_t d = end - 1;
    while (d >= begin) {
      // A run ending at d: inner is its innermost dim of size > 1 (the one whose strides the
      // merged dim takes), span the product of its sizes.
      const int32_t last = d;
      int32_t inner = -1;
      int64_t span = 1;
      std::vector<int64_t> expected(nb, 0);
      for (; d >= begin; --d) {
        if (size(d) == 1) continue;
        if (inner < 0) {
          inner = d;
        } else {
          bool fits = true;
          for (size_t b = 0; b < nb && fits; ++b) {
            const bool bcast = at[b][static_cast<size_t>(d)] < 0, inner_bcast = at[b][static_cast<size_t>(inner)] < 0;
            fits = bcast == inner_bcast && (bcast || stride(b, d) == expected[b]);
          }
          if (!fits) break;
        }
        for (size_t b = 0; b < nb; ++b)
          if (at[b][static_cast<size_t>(d)] >= 0) expected[b] = stride(b, d) * size(d);
        span *= size(d);
      }
      const int32_t first = d + 1;  // the run is [first..last]
      if (inner < 0 || first == last) continue;
      // Positions take the merged dims only where every buffer walks (or broadcasts) as it
      // does at inner: a buffer of lower rank broadcasts at leading dims of any size.
      auto same_status = [&](int32_t e) {
        for (size_t b = 0; b < nb; ++b)
          if ((at[b][static_cast<size_t>(e)] < 0) != (at[b][static_cast<size_t>(inner)] < 0)) return false;
        return true;
      };
      if (!same_status(last)) continue;
      // Where to split: the innermost dims up to 65,536 elements stay inner.
      int64_t inner_span = 1;
      int32_t split = last + 1;  // dims [split..last] form the inner part
      for (int32_t e = last; e >= first && (!split_long_runs || inner_span * size(e) <= 65536); --e) {
        inner_span *= size(e);
        split = e;
      }
      std::vector<int64_t> inner_stride(nb, 0), outer_stride(nb, 0);
      for (size_t b = 0; b < nb; ++b) {
        if (at[b][static_cast<size_t>(inner)] < 0) continue;
        inner_stride[b] = stride(b, inner);
        outer_stride[b] = inner_stride[b] * inner_span;
      }
      const bool two = split > first && inner_span > 1 && inner_span < span && same_status(last - 1);
      for (int32_t e = first; e <= last; ++e) args[static_cast<size_t>(e)] = 1;
      args[static_cast<size_t>(last)] = two ? inner_span : span;
      if (two) args[static_cast<size_t>(last - 1)] = span / inner_span;
      for (size_t b = 0; b < nb; ++b) {
        if (at[b][static_cast<size_t>(last)] < 0) continue;
        args[static_cast<size_t>(at[b][static_cast<size_t>(last)])] = inner_stride[b];
        if (two) args[static_cast<size_t>(at[b][static_cast<size_t>(last - 1)])] = outer_stride[b];
      }
    }
  }
}

}  // namespace

KernelCall kernel_call(const Kernel& kernel, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                       bool split_long_runs) {
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
  coalesce(kernel, call.args, split_long_runs);
  return call;
}

void run_kernel(const CompiledKernel& compiled, const Kernel& kernel, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs) {
  KILN_CHECK(compiled.function != nullptr, "run_kernel {}: the kernel is not compiled", kernel.name);
  const KernelCall call = kernel_call(kernel, inputs, outputs);
  compiled.function(call.buffers.data(), call.args.data());
}

}  // namespace kiln::compiler::codegen
