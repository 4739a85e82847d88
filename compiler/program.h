#pragma once
// A Program: a graph made runnable with generated code (../shared/COMPILER.md, "Targets").
//
//   compiler::Program p(graph);          // fuse, lower, render, compile all kernels
//   std::vector<Tensor> out = p.run(inputs);
//
// Building one runs fuse() (compiler/fusion.h), renders each kernel group's C++ and compiles
// them all in one parallel batch through the kernel cache (compiler/codegen/jit.h), so a
// graph built before compiles nothing. run() does what interpret() does for the same graph
// and inputs (the same input checks, write-backs and returned tensors), except that kernel
// groups run their compiled kernel into fresh outputs, straight into the input a value is
// written back to (see in_place_outputs_), or over an input value that dies there (see
// reuse_input_); eager and view steps go through call_op.
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "compiler/codegen/cuda_run.h"
#include "compiler/codegen/jit.h"
#include "compiler/fusion.h"
#include "compiler/ir/graph.h"
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
  const std::vector<FusionGroup>& steps() const { return steps_; }
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
  int64_t planned_peak_bytes() const { return planned_peak_bytes_; }

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
  // per library op, averaged over the runs since profiling was turned on.
  void set_profiling(bool on);
  bool profiling() const { return profiling_; }
  std::string profile() const;

 private:
  void plan_releases();
  void plan_in_place();
  void plan_reuse();
  void plan_peak();
  struct KernelStep {
    int32_t step = -1;  // index into steps_
    Device device;      // where its outputs live: the CPU (C++ target) or a GPU (CUDA target)
    std::string source;  // the rendering for that target
    codegen::CompiledKernel compiled;  // C++ target
    codegen::CudaFunction cuda;        // CUDA target
    mutable bool tuned = false;        // max-autotune: its launch was timed (tuning holds it)
    mutable codegen::TunedLaunch tuning;
  };
  Graph graph_;
  std::vector<FusionGroup> steps_;
  std::vector<int32_t> kernel_of_;  // per step: index into kernels_, -1 for eager and view
  // Per step: the values no later step, output or write-back reads, dropped after it so
  // that their memory goes back to the allocator (the peak follows liveness). Per output,
  // not per node: batch_norm_backward's input gradient dies at the next step while its
  // weight and bias gradients are outputs (held per node, ResNet-50's backward kept one
  // activation per layer too many, 26 MiB at batch 8).
  std::vector<std::vector<Value>> release_after_;
  std::vector<KernelStep> kernels_;
  // In-place write-backs (the memory plan's first rule): a value that is written back into
  // graph input I is computed straight into I's tensor when no later step reads I's old
  // value (and the step itself reads it only elementwise), so the write-back copies
  // nothing. Per kernel step: per output buffer, the graph input it writes (-1: a fresh
  // tensor). Per eager step: the in-place twin of its op ("sgd_update" -> "sgd_update_")
  // to run instead, when every output is such a write-back of the input it updates.
  std::vector<std::vector<int32_t>> in_place_outputs_;
  std::vector<const OpDef*> in_place_op_;
  // Per eager step of one output written back to an input the step does not read (or reads
  // only at the element it writes: addmm's full-size bias, the gradient it accumulates
  // into): that input, which the op writes its result into (call_op_out), or -1.
  std::vector<int32_t> in_place_eager_;
  // Buffer reuse (the memory plan's second rule): per pointwise kernel step, per output
  // buffer, the position among the kernel's input buffers of a value of the same type that
  // dies at this step and is read only at the element the output writes (-1: none); the
  // output takes that value's memory instead of a fresh tensor, as a relu backward can
  // write its gradient over the incoming one. run() also checks that nothing else holds
  // the memory (no view, no returned tensor, no graph input).
  std::vector<std::vector<int32_t>> reuse_input_;
  int64_t planned_peak_bytes_ = 0;
  int gpu_ = -1;  // the GPU the graph's tensors are on (-1: none): profiling waits for it
  mutable std::vector<Tensor> constants_;  // per node: a constant node's tensor, made at the first run
  mutable std::unordered_set<const StorageImpl*> constant_storages_;  // their memory
  bool profiling_ = false;
  bool autotune_ = false;
  mutable std::vector<double> step_ms_;  // per step: total milliseconds while profiling
  mutable int64_t profiled_runs_ = 0;
};

}  // namespace kiln::compiler
