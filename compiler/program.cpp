// Program (compiler/program.h): the schedule of fused kernels, eager ops and views, run
// step by step as interpret() runs a graph, by the memory plan. Its reports (dumps,
// profile, autotune, CUDA graph blockers) are in compiler/program_report.cpp.
#include "compiler/program.h"

#include <chrono>
#include <cstddef>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "compiler/codegen/cpp_run.h"
#include "compiler/run_graph.h"
#include "core/cuda.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::compiler {

Program::Program(Graph graph, int jobs) : graph_(std::move(graph)) {
  steps_ = fuse(graph_);
  // Each kernel is built for the device its outputs live on: C++ for the CPU, CUDA for a
  // GPU (a step's graph is normally on one device; the per-kernel choice costs nothing).
  kernel_of_.assign(steps_.size(), -1);
  std::vector<const codegen::Kernel*> kernels;
  std::vector<Device> devices;
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (!steps_[s].is_kernel()) continue;
    const codegen::Kernel& kernel = steps_[s].kernel;
    kernel_of_[s] = static_cast<int32_t>(kernels_.size());
    kernels_.push_back({.step = static_cast<int32_t>(s)});
    const codegen::Buffer& out0 = kernel.buffers[static_cast<size_t>(kernel.output_buffers().at(0))];
    kernels.push_back(&kernel);
    devices.push_back(graph_.type({out0.node, out0.output_index}).device);
  }
  for (Value v : graph_.inputs())
    if (graph_.type(v).device.is_cuda()) gpu_ = graph_.type(v).device.index;
  plan_ = plan_memory(graph_, steps_);
  std::vector<codegen::BuiltKernel> built = codegen::build_kernels(kernels, devices, jobs);
  for (size_t k = 0; k < kernels_.size(); ++k) kernels_[k].built = std::move(built[k]);
}

namespace {

// Whether t's memory can be overwritten by a kernel output of `type`: the program's two
// handles (its value slot and the kernel's argument) are the only ones, no view or other
// tensor shares the storage, and t is dense in the type's layout.
bool reusable(const Tensor& t, const TensorType& type) {
  if (!t.defined() || t.impl_ptr().use_count() != 2 || t.storage().use_count() != 1 || !t.storage()->deleter ||
      t.impl()->view_base || t.impl()->autograd || t.offset() != 0)
    return false;
  if (!t.is_contiguous(type.memory_format())) return false;  // no Shape built per kernel output per run
  return t.storage()->nbytes == static_cast<size_t>(t.numel()) * itemsize(t.dtype());
}

// The storages that two or more graph inputs share: writing an input in place there could
// change what another input reads, so those write-backs keep their fresh output and copy.
std::unordered_set<const StorageImpl*> shared_storages(const std::vector<Tensor>& inputs) {
  std::unordered_map<const StorageImpl*, int> count;
  for (const Tensor& t : inputs)
    if (t.defined()) ++count[t.storage().get()];
  std::unordered_set<const StorageImpl*> shared;
  for (const auto& [storage, n] : count)
    if (n > 1) shared.insert(storage);
  return shared;
}

// Adds the time each step of a run takes to a per-step table, when profiling. On a GPU it
// waits for the step's work, so that the time is the work's, not its launch's.
class StepClock {
 public:
  using Clock = std::chrono::steady_clock;
  StepClock(bool on, int gpu, std::vector<double>& step_ms) : on_(on), gpu_(gpu), step_ms_(step_ms) {
    if (on_) start_ = Clock::now();
  }
  void step_done(size_t s) {
    if (!on_) return;
    if (gpu_ >= 0) cuda::synchronize(gpu_);
    const Clock::time_point now = Clock::now();
    step_ms_[s] += std::chrono::duration<double, std::milli>(now - start_).count();
    start_ = now;
  }

 private:
  bool on_;
  int gpu_;
  std::vector<double>& step_ms_;
  Clock::time_point start_;
};

}  // namespace

// One run's tensors: per node, the tensors of its values (dropped when the plan releases
// them), and what the steps need of the call.
struct Program::Run {
  const std::vector<Tensor>& inputs;
  std::vector<std::vector<Tensor>> values;
  RandomBase base;     // random ops are eager steps: call_attrs
  Attrs random_attrs;  // call_attrs' scratch
  std::unordered_set<const StorageImpl*> shared;  // shared_storages(inputs)

  Tensor value(Value v) const {
    if (!v.defined()) return {};
    return values.at(static_cast<size_t>(v.node)).at(static_cast<size_t>(v.output));
  }
  // Whether an input may be written in place: it shares its memory with no other input.
  bool writable(const Tensor& t) const { return !shared.contains(t.storage().get()); }
  void release(const std::vector<Value>& dead) {
    for (Value r : dead) {
      std::vector<Tensor>& outs = values[static_cast<size_t>(r.node)];
      if (static_cast<size_t>(r.output) < outs.size()) outs[static_cast<size_t>(r.output)] = Tensor();
    }
  }
};

std::vector<Tensor> Program::run(const std::vector<Tensor>& inputs) const {
  check_inputs(graph_, inputs, "Program::run");
  make_constants();
  Run run = start_run(inputs);
  NoGradGuard no_grad;
  if (profiling_ && profiled_runs_ == 1 && !first_run_dropped_) {
    // The first run's times hold its page faults and libraries' first calls (oneDNN's
    // primitives, kernel loads); once a second run comes, the table leaves them out.
    std::fill(step_ms_.begin(), step_ms_.end(), 0.0);
    profiled_runs_ = 0;
    first_run_dropped_ = true;
  }
  if (profiling_) ++profiled_runs_;
  StepClock clock(profiling_, gpu_, step_ms_);
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (steps_[s].is_kernel())
      run_kernel_step(s, run);
    else
      run_eager_step(s, run);
    run.release(plan_.release_after[s]);
    clock.step_done(s);
  }
  return finish(run);
}

// Made once: a constant on a GPU is a host-to-device copy, which a captured CUDA graph could
// not repeat (compiler/cuda_graph.h); no step writes a constant, and an output over a
// constant's memory is copied (finish).
void Program::make_constants() const {
  if (!constants_.empty()) return;
  const std::vector<Node>& nodes = graph_.nodes();
  std::vector<Tensor> made(nodes.size());
  std::unordered_set<const StorageImpl*> storages;
  for (size_t n = 0; n < nodes.size(); ++n)
    if (nodes[n].kind == NodeKind::constant) {
      made[n] = constant_tensor(nodes[n]);
      storages.insert(made[n].storage().get());
    }
  constants_ = std::move(made);
  constant_storages_ = std::move(storages);
}

// The inputs' and constants' values, before the first step.
Program::Run Program::start_run(const std::vector<Tensor>& inputs) const {
  const std::vector<Node>& nodes = graph_.nodes();
  Run run{.inputs = inputs, .values = std::vector<std::vector<Tensor>>(nodes.size())};
  for (size_t i = 0; i < graph_.inputs().size(); ++i)
    run.values[static_cast<size_t>(graph_.inputs()[i].node)] = {inputs[i]};
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].kind == NodeKind::constant) run.values[n] = {constants_[n]};
    KILN_CHECK(nodes[n].kind != NodeKind::input || !run.values[n].empty(),
               "Program::run: node {} is an input missing from the graph's inputs", n);
  }
  run.base = random_base(graph_, inputs);
  run.shared = shared_storages(inputs);
  return run;
}

// An eager or view step: the node's op through the registry, in place where the plan says
// so and the tensors allow it.
void Program::run_eager_step(size_t s, Run& run) const {
  const int32_t n = steps_[s].nodes.at(0);
  const Node& node = graph_.nodes()[static_cast<size_t>(n)];
  std::vector<Tensor> args;
  args.reserve(node.inputs.size());
  for (Value v : node.inputs) args.push_back(run.value(v));
  const OpDef& def = node.def ? *node.def : find_op(node.op);
  const Attrs& attrs = call_attrs(node, run.base, run.random_attrs, "Program::run");
  if (steps_[s].converts_result()) return run_converting_step(s, def, std::move(args), attrs, run);
  std::vector<Tensor>& out = run.values[static_cast<size_t>(n)];
  if (const OpDef* twin = plan_.in_place_op[s]) {
    // The in-place twin updates the inputs the pure op would return new copies of, when
    // they can be written as they are (contiguous, sharing storage with no other input).
    std::vector<Tensor> updated;
    for (int m : twin->mutated(attrs)) {
      const Value v = node.inputs.at(static_cast<size_t>(m));
      if (!v.defined()) continue;
      const Tensor& t = args[static_cast<size_t>(m)];
      if (t.is_contiguous() && run.writable(t)) updated.push_back(t);
    }
    if (updated.size() == node.outputs.size()) {
      call_op(*twin, args, attrs);
      out = std::move(updated);
    }
  }
  if (const int32_t target = plan_.in_place_eager[s];
      target >= 0 && run.writable(run.inputs[static_cast<size_t>(target)])) {
    const Tensor& into = run.inputs[static_cast<size_t>(target)];
    call_op_out(def, std::move(args), attrs, into);
    out = {into};
  }
  if (out.empty()) out = call_op(def, std::move(args), attrs);
  KILN_CHECK(out.size() == node.outputs.size(), "Program::run: {} made {} outputs, the graph says {}", node.op,
             out.size(), node.outputs.size());
}

// An eager step whose library call writes its result in the dtype of the cast it took
// along (fusion.h): straight into the cast's tensor, or the graph input it is written back
// to. The CPU kernels of the ops fusion gives a cast (GEMMs, convolutions) compute in f32
// and convert as they store; the CUDA GEMM passes its output's dtype for its operands too,
// so there the result is computed in its own dtype and converted after.
void Program::run_converting_step(size_t s, const OpDef& def, std::vector<Tensor> args, const Attrs& attrs,
                                  Run& run) const {
  const int32_t c = steps_[s].result_node();
  const TensorType& type = graph_.nodes()[static_cast<size_t>(c)].outputs.at(0);
  Tensor into;
  if (const int32_t target = plan_.in_place_eager[s]; target >= 0 && run.writable(run.inputs[static_cast<size_t>(target)]))
    into = run.inputs[static_cast<size_t>(target)];
  else
    into = make_tensor(type.shape, type.dtype, type.device, type.memory_format());
  if (into.device().is_cpu())
    call_op_out(def, std::move(args), attrs, into);
  else
    into.copy_(call_op1(def, std::move(args), attrs));
  run.values[static_cast<size_t>(c)] = {into};
}

// A kernel step: its inputs' tensors, its outputs' (kernel_output), then the launch.
void Program::run_kernel_step(size_t s, Run& run) const {
  const codegen::Kernel& kernel = steps_[s].kernel;
  std::vector<Tensor> kernel_inputs, kernel_outputs;
  for (int32_t b : kernel.input_buffers()) {
    const codegen::Buffer& buffer = kernel.buffers[static_cast<size_t>(b)];
    kernel_inputs.push_back(run.value({buffer.node, buffer.output_index}));  // the base: run_kernel views it
  }
  const std::vector<int32_t> output_buffers = kernel.output_buffers();
  for (size_t j = 0; j < output_buffers.size(); ++j) {
    const codegen::Buffer& buffer = kernel.buffers[static_cast<size_t>(output_buffers[j])];
    Tensor out = kernel_output(s, j, graph_.type({buffer.node, buffer.output_index}), kernel_inputs, run);
    run.values[static_cast<size_t>(buffer.node)] = {out};
    kernel_outputs.push_back(std::move(out));
  }
  launch(kernels_[static_cast<size_t>(kernel_of_[s])], kernel, kernel_inputs, kernel_outputs);
}

// The tensor output buffer j (of type `type`) of kernel step s writes: the graph input it is
// written back to, a dying input's memory, or a fresh tensor (the plan's choice where the
// tensors allow it).
Tensor Program::kernel_output(size_t s, size_t j, const TensorType& type, const std::vector<Tensor>& kernel_inputs,
                              const Run& run) const {
  const int32_t target = plan_.in_place_outputs[s][j];
  const int32_t reuse = plan_.reuse_input[s].empty() ? -1 : plan_.reuse_input[s][j];
  if (target >= 0 && run.writable(run.inputs[static_cast<size_t>(target)]))
    return run.inputs[static_cast<size_t>(target)];  // the write-back, done by the kernel itself
  Tensor out;
  if (reuse >= 0 && reusable(kernel_inputs[static_cast<size_t>(reuse)], type))
    out = kernel_inputs[static_cast<size_t>(reuse)];  // a dying input's memory
  else
    out = make_tensor(type.shape, type.dtype, type.device, type.memory_format());
  out.impl()->wrapped_number = type.wrapped_number;
  return out;
}

// Runs kernel step k's compiled function for its target; with max-autotune a CUDA pointwise
// kernel's launch is timed at its first run (reductions keep theirs).
void Program::launch(const KernelStep& k, const codegen::Kernel& kernel, const std::vector<Tensor>& kernel_inputs,
                     const std::vector<Tensor>& kernel_outputs) const {
  if (!k.built.device.is_cuda()) {
    codegen::run_kernel(k.built.compiled, kernel, kernel_inputs, kernel_outputs);
    return;
  }
  if (autotune_ && !k.tuned && kernel.num_reduced == 0) {
    k.tuning = codegen::tune_cuda_launch(k.built.cuda, kernel, kernel_inputs, kernel_outputs);
    k.tuned = true;
  }
  codegen::run_cuda_kernel(k.built.cuda, kernel, kernel_inputs, kernel_outputs, k.tuning.tuning);
}

// The write-backs and outputs (finish_run). A result over a constant's memory (a view of a
// folded constant) is the caller's to change: a copy, so that the constant stays what the
// next run reads.
std::vector<Tensor> Program::finish(Run& run) const {
  std::vector<Tensor> outputs = finish_run(graph_, run.inputs, [&run](Value v) { return run.value(v); });
  for (Tensor& out : outputs)
    if (out.defined() && constant_storages_.contains(out.storage().get())) out = out.clone();
  return outputs;
}

}  // namespace kiln::compiler
