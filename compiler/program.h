#pragma once
// A Program: a graph made runnable with generated code (../shared/COMPILER.md, "Targets").
//
//   compiler::Program p(graph);          // fuse, lower, render, compile all kernels
//   std::vector<Tensor> out = p.run(inputs);
//
// Building one runs fuse() (compiler/fusion.h), plans memory (plan_memory,
// compiler/passes/memory_plan.h) and builds each kernel group for its target
// (build_kernels, compiler/codegen/build.h: C++ compiled in one parallel batch through the
// kernel cache, so a graph built before compiles nothing; CUDA through NVRTC). run() does
// what interpret() does for the same graph and inputs (the same input checks, write-backs
// and returned tensors), step by step: kernel groups run their compiled kernel into fresh
// outputs, straight into the input a value is written back to, or over an input value that
// dies there, as the plan says; eager and view steps go through call_op. What a Program
// reports about itself (dumps, profile, autotune, CUDA graph blockers) is in
// compiler/program_report.cpp.
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "compiler/codegen/build.h"
#include "compiler/codegen/cuda_run.h"
#include "compiler/fusion.h"
#include "compiler/ir/graph.h"
#include "compiler/passes/memory_plan.h"
#include "core/tensor.h"

namespace kiln::compiler {

class Program {
 public:
  // kiln::Error when the host compiler fails on a kernel. `jobs`: compiler processes at once.
  explicit Program(Graph graph, int jobs = 2);

  // The graph's outputs for `inputs` (the tensors of the graph inputs, in order; kiln::Error
  // naming an input whose dtype, shape or device differs). Write-backs are copied into their
  // input tensors; an output that is the new content of an input is that input tensor.
  // No autograd is recorded.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;

  const Graph& graph() const { return graph_; }
  const std::vector<ScheduleStep>& steps() const { return steps_; }
  int64_t num_steps() const { return static_cast<int64_t>(steps_.size()); }
  int64_t num_kernels() const { return static_cast<int64_t>(kernels_.size()); }

  // Kernel k (in schedule order): its name in the dumps ("k0_mul_add_relu"), its kernel IR
  // text and its C++ source.
  std::string kernel_name(int64_t k) const;
  std::string kernel_ir(int64_t k) const;
  const std::string& kernel_source(int64_t k) const;
  // Every kernel's IR, and every kernel's source, each headed by its name (for dumps).
  std::string kernels_text() const;
  std::string sources_text() const;

  // The memory plan's peak: the most bytes of values made by the program alive at once
  // (graph inputs and library ops' scratch not counted), with the in-place write-backs and
  // buffer reuse planned; views cost nothing, outputs live to the end. An estimate: run()
  // allocates where a planned reuse or in-place write fails its run-time check.
  int64_t planned_peak_bytes() const { return plan_.peak_bytes; }
  // The whole plan: releases, in-place write-backs, buffer reuse, peak.
  const MemoryPlan& memory_plan() const { return plan_; }

  // One line per step: kernels with their kind, space and nodes, eager ops, views.
  std::string describe() const;

  // Why the program cannot run as a captured CUDA graph (compile's reduce-overhead mode,
  // compiler/cuda_graph.h), or "" when it can: its inputs and every step live on one GPU,
  // and no step reads the host (random ops take their counters from the host at each run;
  // an eager op given a CPU tensor copies it over). What the capture itself refuses (an op
  // that reads a value back, or waits for the GPU) is found only by capturing.
  std::string cuda_graph_blocker() const;
  int gpu() const { return gpu_; }  // the GPU of the graph's tensors, -1 for none

  // compile's max-autotune: when on, each CUDA pointwise kernel's launch is chosen by
  // timing candidates (codegen::tune_cuda_launch) at the kernel's first run and kept.
  // autotune_report() lists the kernels tuned: launch chosen, its time, the default's.
  void set_autotune(bool on) { autotune_ = on; }
  std::string autotune_report() const;

  // Profiling: when on, run() times every step (with a clock read per step, so leave it
  // off when not looking). profile() is a table of where a run's time goes, per kernel and
  // per library op, averaged over the runs since profiling was turned on (leaving out the
  // first of them once there is a second).
  void set_profiling(bool on);
  bool profiling() const { return profiling_; }
  std::string profile() const;

 private:
  struct KernelStep {
    int32_t step = -1;           // index into steps_
    codegen::BuiltKernel built;  // its device, source and compiled function
    mutable bool tuned = false;  // max-autotune: its launch was timed (tuning holds it)
    mutable codegen::TunedLaunch tuning;
  };
  struct Run;  // one run's tensors (program.cpp)
  void make_constants() const;
  Run start_run(const std::vector<Tensor>& inputs) const;
  void run_eager_step(size_t s, Run& run) const;
  void run_converting_step(size_t s, const OpDef& def, std::vector<Tensor> args, const Attrs& attrs, Run& run) const;
  void run_kernel_step(size_t s, Run& run) const;
  Tensor kernel_output(size_t s, size_t j, const TensorType& type, const std::vector<Tensor>& kernel_inputs,
                       const Run& run) const;
  void launch(const KernelStep& k, const codegen::Kernel& kernel, const std::vector<Tensor>& kernel_inputs,
              const std::vector<Tensor>& kernel_outputs) const;
  std::vector<Tensor> finish(Run& run) const;

  Graph graph_;
  std::vector<ScheduleStep> steps_;
  std::vector<int32_t> kernel_of_;  // per step: index into kernels_, -1 for eager and view
  std::vector<KernelStep> kernels_;
  MemoryPlan plan_;
  int gpu_ = -1;  // the GPU the graph's tensors are on (-1: none): profiling waits for it
  mutable std::vector<Tensor> constants_;  // per node: a constant node's tensor, made at the first run
  mutable std::unordered_set<const StorageImpl*> constant_storages_;  // their memory
  bool profiling_ = false;
  bool autotune_ = false;
  mutable std::vector<double> step_ms_;  // per step: total milliseconds while profiling
  mutable int64_t profiled_runs_ = 0;
  mutable bool first_run_dropped_ = false;  // the first profiled run's times were left out
};

}  // namespace kiln::compiler
