#pragma once
// A roofline cost model of a compiled step on a named GPU, computed on any machine: for
// every step of a schedule (compiler/fusion.h), the bytes it reads and writes, its FLOPs,
// the kernels it launches and the time the GPU's published peaks allow it; the step's
// totals; and the step's minimum traffic, against which the planned traffic is a ratio.
// GPUs are lent rarely, so this is how the CUDA work is steered between GPU runs
// (docs/cuda.md, "The cost model", says how far its predictions were from measured steps).
//
//   const compiler::CostReport r = compiler::estimate_cost(graph, fuse(graph), gpu_spec("h200"));
//   std::cout << compiler::cost_table(r);
//
// What each step costs:
// - a generated kernel (pointwise or reduction): one launch; it reads every value it takes
//   from outside the step once (a broadcast input at its own size, not the kernel's) and
//   writes every value used after it; a FLOP per node and element;
// - a library call: its operands and results, plus what the op's registry entry says its
//   CUDA implementation adds (OpDef::gpu_work, from kernels/gpu_work.cpp): cuDNN's batch
//   norm reads its input twice and its backward reads x and dy twice; 16-bit batch norm
//   converts to f32 and back; NCHW convolutions in TF32 or 16-bit transpose their
//   activations to NHWC and back for the tensor-core kernels; the FLOPs of convolutions
//   and products, which run at the tensor-core rate of their precision;
// - a view: nothing.
// The roofline time of a step is max(bytes / bandwidth, FLOPs / rate); launch overhead is
// counted apart (it vanishes in a replayed CUDA graph).
//
// The minimum traffic: every value that must exist in memory (graph inputs that are read,
// the operands and results of library ops, the step's outputs and write-backs) written once
// if the step computes it, and read once by each library op that takes it plus once by all
// the generated work that takes it (perfect fusion); everything else stays in registers.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/fusion.h"
#include "compiler/ir/graph.h"

namespace kiln::compiler {

// A GPU's published peak rates (dense: no structured sparsity). The one table is gpu_specs().
struct GpuSpec {
  std::string name;         // "h200": what --gpu takes
  std::string description;  // "NVIDIA H200 SXM, 141 GB HBM3e"
  double memory_bytes_per_s = 0;
  double fp32_flops = 0;  // CUDA cores, an FMA counted as two
  double tf32_flops = 0;  // tensor cores
  double bf16_flops = 0;  // tensor cores; f16 the same
  double launch_s = 0;    // the host's cost of one kernel launch outside a CUDA graph
};
const std::vector<GpuSpec>& gpu_specs();
// kiln::Error naming the known GPUs for another name.
const GpuSpec& gpu_spec(std::string_view name);

struct CostOptions {
  bool tf32 = true;  // f32 convolutions and products on TF32 tensor cores (kiln-train's CUDA default)
};

struct StepCost {
  size_t step = 0;   // index into the schedule
  std::string name;  // the kernel's name, or the library op's
  std::string kind;  // "pointwise", "reduction", "library", "view"
  int64_t bytes_read = 0, bytes_written = 0;
  double flops = 0;
  int64_t launches = 0;
  double seconds = 0;  // roofline
  bool compute_bound = false;
  std::string note;  // what the implementation adds ("nchw: transposes in and out", ...)
};

struct CostReport {
  std::string gpu;
  std::vector<StepCost> steps;
  int64_t bytes = 0;          // planned traffic, read and written
  int64_t minimum_bytes = 0;  // the minimum traffic above
  double flops = 0;
  int64_t launches = 0;
  int64_t groups = 0;    // steps that are not views: what one launch each would be
  double seconds = 0;    // the steps' roofline times summed
  double launch_s = 0;   // launches times the GPU's launch cost
  double traffic_ratio() const { return minimum_bytes > 0 ? static_cast<double>(bytes) / minimum_bytes : 0; }
  double launch_ratio() const { return groups > 0 ? static_cast<double>(launches) / groups : 0; }
};

// The costs of `schedule` (fuse(graph)) on `gpu`.
CostReport estimate_cost(const Graph& graph, const std::vector<ScheduleStep>& schedule, const GpuSpec& gpu,
                         const CostOptions& options = {});

// One line per step (bytes, FLOPs, launches, roofline microseconds, bound, note), then the
// totals per kind and for the step, with the ratios to the minimum traffic and to the groups.
std::string cost_table(const CostReport& report);
// The totals as JSON fields (no braces): "gpu":"h200","predicted_ms":..., for kiln-bench plan.
std::string cost_json_fields(const CostReport& report);

}  // namespace kiln::compiler
