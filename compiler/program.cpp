// Program (compiler/program.h): the schedule of fused kernels, eager ops and views, run
// as interpret() runs a graph.
#include "compiler/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstddef>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "compiler/codegen/cpp.h"
#include "compiler/codegen/cuda.h"
#include "compiler/codegen/run.h"
#include "compiler/run_graph.h"
#include "core/cuda.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::compiler {

Program::Program(Graph graph, int jobs) : graph_(std::move(graph)) {
  steps_ = fuse(graph_);
  kernel_of_.assign(steps_.size(), -1);
  // Each kernel is rendered for the device its outputs live on: C++ for the CPU, CUDA for a
  // GPU (a step's graph is normally on one device; the per-kernel choice costs nothing).
  std::vector<std::pair<std::string, std::string>> cpp_sources;
  std::vector<size_t> cpp_kernels;
  std::map<int, std::vector<size_t>> cuda_kernels;  // per GPU
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (!steps_[s].is_kernel()) continue;
    const codegen::Kernel& kernel = steps_[s].kernel;
    kernel_of_[s] = static_cast<int32_t>(kernels_.size());
    KernelStep k;
    k.step = static_cast<int32_t>(s);
    const codegen::Buffer& out0 = kernel.buffers[static_cast<size_t>(kernel.output_buffers().at(0))];
    k.device = graph_.nodes()[static_cast<size_t>(out0.node)].outputs.at(static_cast<size_t>(out0.output_index)).device;
    if (k.device.is_cuda()) {
      k.source = codegen::render_cuda(kernel);
      cuda_kernels[k.device.index].push_back(kernels_.size());
    } else {
      k.source = codegen::render_cpp(kernel);
      cpp_sources.emplace_back(k.source, codegen::cpp_symbol(kernel));
      cpp_kernels.push_back(kernels_.size());
    }
    kernels_.push_back(std::move(k));
  }
  for (Value v : graph_.inputs())
    if (graph_.type(v).device.is_cuda()) gpu_ = graph_.type(v).device.index;
  plan_releases();
  plan_in_place();
  plan_reuse();
  plan_peak();
  const std::vector<codegen::CompiledKernel> compiled = codegen::compile_cpp_batch(cpp_sources, jobs);
  for (size_t i = 0; i < cpp_kernels.size(); ++i) kernels_[cpp_kernels[i]].compiled = compiled[i];
  for (const auto& [device, ks] : cuda_kernels) {
    std::vector<const codegen::Kernel*> kernels;
    for (size_t k : ks) kernels.push_back(&steps_[static_cast<size_t>(kernels_[k].step)].kernel);
    const std::vector<codegen::CudaFunction> loaded = codegen::load_cuda_kernels(kernels, Device::cuda(device), jobs);
    for (size_t i = 0; i < ks.size(); ++i) kernels_[ks[i]].cuda = loaded[i];
  }
}

void Program::plan_releases() {
  constexpr int32_t kKeep = std::numeric_limits<int32_t>::max();
  const std::vector<Node>& nodes = graph_.nodes();
  // Per node, per output: the last step that reads it, and the step that makes it.
  std::vector<std::vector<int32_t>> last_use(nodes.size());
  std::vector<int32_t> defined_at(nodes.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n) last_use[n].assign(nodes[n].outputs.size(), -1);
  auto slot = [&](Value v) -> int32_t& { return last_use.at(static_cast<size_t>(v.node)).at(static_cast<size_t>(v.output)); };
  auto use = [&](Value v, int32_t step) {
    if (v.defined() && slot(v) != kKeep) slot(v) = step;
  };
  for (Value v : graph_.outputs()) slot(v) = kKeep;
  for (const auto& [input, value] : graph_.write_backs()) {
    slot(input) = kKeep;
    slot(value) = kKeep;
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    const auto step = static_cast<int32_t>(s);
    const FusionGroup& group = steps_[s];
    if (group.is_kernel()) {
      for (int32_t b : group.kernel.input_buffers()) {
        const codegen::Buffer& in = group.kernel.buffers[static_cast<size_t>(b)];
        use({in.node, in.output_index}, step);
      }
      for (int32_t b : group.kernel.output_buffers())
        defined_at[static_cast<size_t>(group.kernel.buffers[static_cast<size_t>(b)].node)] = step;
    } else {
      const int32_t n = group.nodes.at(0);
      for (Value v : nodes[static_cast<size_t>(n)].inputs) use(v, step);
      defined_at[static_cast<size_t>(n)] = step;
    }
  }
  release_after_.assign(steps_.size(), {});
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].kind != NodeKind::op) continue;
    for (size_t o = 0; o < last_use[n].size(); ++o) {
      const int32_t last = last_use[n][o];
      if (last == kKeep) continue;
      const int32_t after = last >= 0 ? std::max(last, defined_at[n]) : defined_at[n];
      if (after >= 0)
        release_after_[static_cast<size_t>(after)].push_back({static_cast<int32_t>(n), static_cast<int32_t>(o)});
    }
  }
}

namespace {

// The input the node's op adds its result to (OpDef::accumulator_input), or -1.
int accumulator_input(const Node& node, const Graph& g) {
  if (!node.def || !node.def->accumulator) return -1;
  std::vector<TensorMeta> metas;
  for (Value v : node.inputs) {
    TensorMeta m = v.defined() ? g.type(v).meta() : TensorMeta{};
    m.defined = v.defined();
    metas.push_back(std::move(m));
  }
  return node.def->accumulator_input(metas);
}

}  // namespace

void Program::plan_in_place() {
  const std::vector<Node>& nodes = graph_.nodes();
  const auto num_inputs = static_cast<int32_t>(graph_.inputs().size());
  std::unordered_map<int32_t, int32_t> input_of_node;  // input node -> its index in inputs()
  for (int32_t i = 0; i < num_inputs; ++i) input_of_node[graph_.inputs()[static_cast<size_t>(i)].node] = i;
  // The graph input a value views (through view nodes), or -1.
  auto input_behind = [&](int32_t n) {
    while (n >= 0 && nodes[static_cast<size_t>(n)].kind == NodeKind::op &&
           nodes[static_cast<size_t>(n)].def->kind == OpKind::view)
      n = nodes[static_cast<size_t>(n)].inputs.at(0).node;
    auto it = input_of_node.find(n);
    return it == input_of_node.end() ? -1 : it->second;
  };
  // The last step that reads each input's old value, directly or through views; an output
  // that returns it (or a view of it) reads it after every step.
  constexpr int32_t kAfterAll = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> last_read(static_cast<size_t>(num_inputs), -1);
  auto read = [&](int32_t node, int32_t step) {
    const int32_t i = input_behind(node);
    if (i >= 0) last_read[static_cast<size_t>(i)] = std::max(last_read[static_cast<size_t>(i)], step);
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& group = steps_[s];
    if (group.is_kernel()) {
      for (int32_t b : group.kernel.input_buffers())
        read(group.kernel.buffers[static_cast<size_t>(b)].node, static_cast<int32_t>(s));
    } else {
      for (Value v : nodes[static_cast<size_t>(group.nodes.at(0))].inputs)
        if (v.defined()) read(v.node, static_cast<int32_t>(s));
    }
  }
  for (Value v : graph_.outputs()) read(v.node, kAfterAll);
  // Which input each written-back value goes to (values written back twice: none).
  std::map<std::pair<int32_t, int32_t>, int32_t> target_of;
  for (const auto& [input, value] : graph_.write_backs()) {
    const auto key = std::pair{value.node, value.output};
    const auto i = input_of_node.at(input.node);
    const auto [it, inserted] = target_of.emplace(key, i);
    if (!inserted) it->second = -1;
  }
  auto target = [&](int32_t node, int32_t output) {
    auto it = target_of.find({node, output});
    return it == target_of.end() ? -1 : it->second;
  };

  in_place_outputs_.assign(steps_.size(), {});
  in_place_op_.assign(steps_.size(), nullptr);
  in_place_eager_.assign(steps_.size(), -1);
  for (size_t s = 0; s < steps_.size(); ++s) {
    const auto step = static_cast<int32_t>(s);
    const FusionGroup& group = steps_[s];
    if (group.is_kernel()) {
      const codegen::Kernel& k = group.kernel;
      std::vector<int32_t>& plan = in_place_outputs_[s];
      for (int32_t ob : k.output_buffers()) {
        const codegen::Buffer& out = k.buffers[static_cast<size_t>(ob)];
        const int32_t i = target(out.node, out.output_index);
        bool ok = i >= 0 && last_read[static_cast<size_t>(i)] <= step;
        // Read by this kernel too: only at the element it writes (no view, same walk).
        for (int32_t ib : k.input_buffers()) {
          const codegen::Buffer& in = k.buffers[static_cast<size_t>(ib)];
          if (ok && input_behind(in.node) == i) ok = in.views.empty() && in.dim_of == out.dim_of;
        }
        plan.push_back(ok ? i : -1);
      }
      continue;
    }
    if (group.kind != FusionGroup::eager) continue;
    const Node& node = nodes[static_cast<size_t>(group.nodes.at(0))];
    if (node.outputs.size() == 1) {
      const int32_t i = target(group.nodes.at(0), 0);
      if (i >= 0 && last_read[static_cast<size_t>(i)] < step) {
        in_place_eager_[s] = i;
        continue;
      }
      // An op adding its result to the input it writes back to (gemm_epilogues: grad +
      // mm(a, b), grad + a convolution's weight gradient) reads that input only at the
      // element it writes, so it may run in place when no other operand reads the input.
      const int acc = accumulator_input(node, graph_);
      bool in_place = i >= 0 && acc >= 0 && last_read[static_cast<size_t>(i)] <= step &&
                      node.inputs[static_cast<size_t>(acc)].node == graph_.inputs()[static_cast<size_t>(i)].node;
      for (size_t k = 0; k < node.inputs.size() && in_place; ++k)
        in_place = static_cast<int>(k) == acc || !node.inputs[k].defined() || input_behind(node.inputs[k].node) != i;
      if (in_place) {
        in_place_eager_[s] = i;
        continue;
      }
    }
    const OpDef* twin = find_op(node.op).in_place_twin;  // sgd_update -> sgd_update_
    if (!twin) continue;
    // The pure op's outputs are the new values of the twin's mutated inputs that are given,
    // in order: each must be written back to exactly that input, read by no later step.
    bool ok = true;
    size_t output = 0;
    for (int m : twin->mutated(node.attrs)) {
      const Value in = node.inputs.at(static_cast<size_t>(m));
      if (!in.defined()) continue;
      const auto it = input_of_node.find(in.node);
      const int32_t i = it == input_of_node.end() ? -1 : it->second;
      ok = ok && output < node.outputs.size() && i >= 0 &&
           target(group.nodes.at(0), static_cast<int32_t>(output)) == i && last_read[static_cast<size_t>(i)] <= step;
      ++output;
    }
    if (ok && output == node.outputs.size()) in_place_op_[s] = twin;
  }
}

void Program::plan_reuse() {
  const std::vector<Node>& nodes = graph_.nodes();
  reuse_input_.assign(steps_.size(), {});
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& group = steps_[s];
    if (group.kind != FusionGroup::pointwise) continue;
    const codegen::Kernel& k = group.kernel;
    const std::vector<int32_t> ins = k.input_buffers(), outs = k.output_buffers();
    std::vector<int32_t>& plan = reuse_input_[s];
    plan.assign(outs.size(), -1);
    std::vector<bool> taken(ins.size(), false);
    for (size_t j = 0; j < outs.size(); ++j) {
      if (in_place_outputs_[s][j] >= 0) continue;  // computed into a graph input already
      const codegen::Buffer& out = k.buffers[static_cast<size_t>(outs[j])];
      const TensorType& type = nodes[static_cast<size_t>(out.node)].outputs.at(static_cast<size_t>(out.output_index));
      for (size_t r = 0; r < ins.size() && plan[j] < 0; ++r) {
        const codegen::Buffer& in = k.buffers[static_cast<size_t>(ins[r])];
        const Value v{in.node, in.output_index};
        const Node& maker = nodes[static_cast<size_t>(in.node)];
        const std::vector<Value>& dying = release_after_[s];
        if (taken[r] || maker.kind != NodeKind::op || !in.views.empty() || in.dim_of != out.dim_of ||
            maker.outputs.at(static_cast<size_t>(in.output_index)) != type ||
            std::find(dying.begin(), dying.end(), v) == dying.end())
          continue;
        // Read through a second buffer (another view of it) by this kernel: not only at
        // the element written.
        bool read_twice = false;
        for (size_t q = 0; q < ins.size(); ++q) {
          const codegen::Buffer& other = k.buffers[static_cast<size_t>(ins[q])];
          read_twice |= q != r && other.node == in.node && other.output_index == in.output_index;
        }
        if (read_twice) continue;
        plan[j] = static_cast<int32_t>(r);
        taken[r] = true;
      }
    }
  }
}

void Program::plan_peak() {
  // Values map to buffers: a fresh output makes one, a view or a reused input shares its
  // base's, a write-back computed in place uses the graph input's (not counted). A buffer
  // is freed when the last value on it is released.
  const std::vector<Node>& nodes = graph_.nodes();
  std::map<Value, int32_t> buffer_of;
  std::vector<int64_t> bytes;
  std::vector<int32_t> holders;
  int64_t live = 0;
  planned_peak_bytes_ = 0;
  auto fresh = [&](Value v) {
    const TensorType& t = nodes[static_cast<size_t>(v.node)].outputs.at(static_cast<size_t>(v.output));
    buffer_of[v] = static_cast<int32_t>(bytes.size());
    bytes.push_back(t.defined ? numel_of(t.shape) * static_cast<int64_t>(itemsize(t.dtype)) : 0);
    holders.push_back(1);
    live += bytes.back();
  };
  auto share = [&](Value v, Value with) {
    const auto it = buffer_of.find(with);
    if (it == buffer_of.end()) return;  // a graph input's memory, or a constant
    buffer_of[v] = it->second;
    ++holders[static_cast<size_t>(it->second)];
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& group = steps_[s];
    if (group.is_kernel()) {
      const codegen::Kernel& k = group.kernel;
      const std::vector<int32_t> ins = k.input_buffers(), outs = k.output_buffers();
      for (size_t j = 0; j < outs.size(); ++j) {
        const codegen::Buffer& out = k.buffers[static_cast<size_t>(outs[j])];
        const int32_t reuse = reuse_input_[s].empty() ? -1 : reuse_input_[s][j];
        if (in_place_outputs_[s][j] >= 0) continue;
        if (reuse >= 0) {
          const codegen::Buffer& in = k.buffers[static_cast<size_t>(ins[static_cast<size_t>(reuse)])];
          share({out.node, out.output_index}, {in.node, in.output_index});
        } else {
          fresh({out.node, out.output_index});
        }
      }
    } else {
      const int32_t n = group.nodes.at(0);
      const Node& node = nodes[static_cast<size_t>(n)];
      if (group.kind == FusionGroup::view) {
        share({n, 0}, node.inputs.at(0));
      } else if (!in_place_op_[s] && in_place_eager_[s] < 0) {
        for (size_t o = 0; o < node.outputs.size(); ++o) fresh({n, static_cast<int32_t>(o)});
      }
    }
    planned_peak_bytes_ = std::max(planned_peak_bytes_, live);
    for (Value r : release_after_[s]) {
      const auto it = buffer_of.find(r);
      if (it == buffer_of.end()) continue;
      if (--holders[static_cast<size_t>(it->second)] == 0) live -= bytes[static_cast<size_t>(it->second)];
      buffer_of.erase(it);
    }
  }
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

}  // namespace

std::vector<Tensor> Program::run(const std::vector<Tensor>& inputs) const {
  const Graph& g = graph_;
  check_inputs(g, inputs, "Program::run");
  const std::vector<Node>& nodes = g.nodes();
  std::vector<std::vector<Tensor>> values(nodes.size());
  for (size_t i = 0; i < g.inputs().size(); ++i) values[static_cast<size_t>(g.inputs()[i].node)] = {inputs[i]};
  if (constants_.empty()) {
    // Made once: a constant on a GPU is a host-to-device copy, which a captured CUDA graph
    // could not repeat (compiler/cuda_graph.h); no step writes a constant, and an output
    // over a constant's memory is copied (below).
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
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].kind == NodeKind::constant) values[n] = {constants_[n]};
    KILN_CHECK(nodes[n].kind != NodeKind::input || !values[n].empty(),
               "Program::run: node {} is an input missing from the graph's inputs", n);
  }
  auto value = [&](Value v) -> Tensor {
    if (!v.defined()) return {};
    return values.at(static_cast<size_t>(v.node)).at(static_cast<size_t>(v.output));
  };

  const RandomBase base = random_base(g, inputs);  // random ops are eager steps: call_attrs
  Attrs random_attrs;
  auto release = [&](size_t s) {
    for (Value r : release_after_[s]) {
      std::vector<Tensor>& outs = values[static_cast<size_t>(r.node)];
      if (static_cast<size_t>(r.output) < outs.size()) outs[static_cast<size_t>(r.output)] = Tensor();
    }
  };
  const std::unordered_set<const StorageImpl*> shared = shared_storages(inputs);
  auto writable = [&](const Tensor& t) { return !shared.contains(t.storage().get()); };

  NoGradGuard no_grad;
  using Clock = std::chrono::steady_clock;
  Clock::time_point step_start;
  // Adds the time since step_start to step s (profiling only).
  auto clock_step = [&](size_t s) {
    if (!profiling_) return;
    if (gpu_ >= 0) cuda::synchronize(gpu_);  // the step's GPU work, not its launch
    const Clock::time_point now = Clock::now();
    step_ms_[s] += std::chrono::duration<double, std::milli>(now - step_start).count();
    step_start = now;
  };
  if (profiling_) {
    ++profiled_runs_;
    step_start = Clock::now();
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& step = steps_[s];
    if (!step.is_kernel()) {
      const int32_t n = step.nodes.at(0);
      const Node& node = nodes[static_cast<size_t>(n)];
      std::vector<Tensor> args;
      args.reserve(node.inputs.size());
      for (Value v : node.inputs) args.push_back(value(v));
      const OpDef& def = node.def ? *node.def : find_op(node.op);
      const Attrs& attrs = call_attrs(node, base, random_attrs, "Program::run");
      std::vector<Tensor>& out = values[static_cast<size_t>(n)];
      if (const OpDef* twin = in_place_op_[s]) {
        // The in-place twin updates the inputs the pure op would return new copies of, when
        // they can be written as they are (contiguous, sharing storage with no other input).
        std::vector<Tensor> updated;
        for (int m : twin->mutated(attrs)) {
          const Value v = node.inputs.at(static_cast<size_t>(m));
          if (!v.defined()) continue;
          const Tensor& t = args[static_cast<size_t>(m)];
          if (t.is_contiguous() && writable(t)) updated.push_back(t);
        }
        if (updated.size() == node.outputs.size()) {
          call_op(*twin, args, attrs);
          out = std::move(updated);
        }
      }
      if (const int32_t target = in_place_eager_[s]; target >= 0 && writable(inputs[static_cast<size_t>(target)])) {
        const Tensor& into = inputs[static_cast<size_t>(target)];
        call_op_out(def, std::move(args), attrs, into);
        out = {into};
      }
      if (out.empty()) out = call_op(def, std::move(args), attrs);
      KILN_CHECK(out.size() == node.outputs.size(), "Program::run: {} made {} outputs, the graph says {}",
                 node.op, out.size(), node.outputs.size());
      release(s);
      clock_step(s);
      continue;
    }
    const codegen::Kernel& kernel = step.kernel;
    std::vector<Tensor> kernel_inputs, kernel_outputs;
    for (int32_t b : kernel.input_buffers()) {
      const codegen::Buffer& buffer = kernel.buffers[static_cast<size_t>(b)];
      kernel_inputs.push_back(value({buffer.node, buffer.output_index}));  // the base: run_kernel views it
    }
    const std::vector<int32_t>& in_place = in_place_outputs_[s];
    const std::vector<int32_t> output_buffers = kernel.output_buffers();
    for (size_t j = 0; j < output_buffers.size(); ++j) {
      const codegen::Buffer& buffer = kernel.buffers[static_cast<size_t>(output_buffers[j])];
      const TensorType& type = nodes[static_cast<size_t>(buffer.node)].outputs.at(static_cast<size_t>(buffer.output_index));
      const int32_t target = in_place[j];
      const int32_t reuse = reuse_input_[s].empty() ? -1 : reuse_input_[s][j];
      Tensor out;
      if (target >= 0 && writable(inputs[static_cast<size_t>(target)])) {
        out = inputs[static_cast<size_t>(target)];  // the write-back, done by the kernel itself
      } else if (reuse >= 0 && reusable(kernel_inputs[static_cast<size_t>(reuse)], type)) {
        out = kernel_inputs[static_cast<size_t>(reuse)];  // a dying input's memory
        out.impl()->wrapped_number = type.wrapped_number;
      } else {
        out = make_tensor(type.shape, type.dtype, type.device, type.memory_format());
        out.impl()->wrapped_number = type.wrapped_number;
      }
      values[static_cast<size_t>(buffer.node)] = {out};
      kernel_outputs.push_back(std::move(out));
    }
    const KernelStep& k = kernels_[static_cast<size_t>(kernel_of_[s])];
    if (k.device.is_cuda() && autotune_ && !k.tuned && kernel.num_reduced == 0) {  // (reductions keep theirs)
      k.tuning = codegen::tune_cuda_launch(k.cuda, kernel, kernel_inputs, kernel_outputs);
      k.tuned = true;
    }
    if (k.device.is_cuda())
      codegen::run_cuda_kernel(k.cuda, kernel, kernel_inputs, kernel_outputs, k.tuning.tuning);
    else
      codegen::run_kernel(k.compiled, kernel, kernel_inputs, kernel_outputs);
    kernel_inputs.clear();
    kernel_outputs.clear();
    release(s);
    clock_step(s);
  }

  std::vector<Tensor> outputs = finish_run(g, inputs, value);
  // A result over a constant's memory (a view of a folded constant) is the caller's to
  // change: a copy, so that the constant stays what the next run reads.
  for (Tensor& out : outputs)
    if (out.defined() && constant_storages_.contains(out.storage().get())) out = out.clone();
  return outputs;
}

std::string Program::cuda_graph_blocker() const {
  const Graph& g = graph_;
  if (gpu_ < 0) return "the graph runs on the CPU";
  for (Value v : g.inputs()) {
    const Node& input = g.node(v);
    if (input.role == InputRole::random)
      return "its random ops draw their Philox counters on the host at every run";
    const Device device = g.type(v).device;
    if (device != Device::cuda(gpu_))
      return fmt::format("input \"{}\" is on {}, not cuda:{}", input.name, device, gpu_);
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& step = steps_[s];
    if (step.is_kernel()) {
      const Device device = kernels_[static_cast<size_t>(kernel_of_[s])].device;
      if (device != Device::cuda(gpu_)) return fmt::format("kernel {} runs on {}", step.kernel.name, device);
      continue;
    }
    const Node& node = g.nodes()[static_cast<size_t>(step.nodes.at(0))];
    for (Value v : node.inputs)
      if (v.defined() && g.type(v).device != Device::cuda(gpu_))
        return fmt::format("{} reads a tensor on {} (%{})", node.op, g.type(v).device, g.value_number(v));
    for (const TensorType& t : node.outputs)
      if (t.defined && t.device != Device::cuda(gpu_)) return fmt::format("{} makes a tensor on {}", node.op, t.device);
  }
  return {};
}

void Program::set_profiling(bool on) {
  profiling_ = on;
  step_ms_.assign(steps_.size(), 0.0);
  profiled_runs_ = 0;
}

std::string Program::profile() const {
  if (profiled_runs_ == 0) return "no profiled runs (Program::set_profiling(true), or KILN_PROFILE=1)\n";
  // Steps with the same label (a kernel's name, or the library op) are summed: the table
  // says where the time goes by kind of work, as a profiler's flat view would.
  struct Row {
    double ms = 0;
    int64_t steps = 0;
  };
  std::map<std::string, Row> rows;
  double total = 0;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& step = steps_[s];
    const std::string label = step.is_kernel()
                                  ? fmt::format("kernel {}", step.kernel.name)
                                  : fmt::format("{} {}", kind_name(step.kind),
                                                graph_.nodes()[static_cast<size_t>(step.nodes.at(0))].op);
    Row& row = rows[label];
    row.ms += step_ms_[s] / static_cast<double>(profiled_runs_);
    ++row.steps;
    total += step_ms_[s] / static_cast<double>(profiled_runs_);
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::string out = fmt::format("{:<40} {:>10} {:>7} {:>6}\n", "step (per run)", "ms", "%", "steps");
  for (const auto& [label, row] : sorted)
    out += fmt::format("{:<40} {:>10.3f} {:>6.1f}% {:>6}\n", label, row.ms, total > 0 ? 100 * row.ms / total : 0.0,
                       row.steps);
  out += fmt::format("{:<40} {:>10.3f} {:>6.1f}% {:>6}   ({} runs)\n", "total", total, 100.0, steps_.size(),
                     profiled_runs_);
  return out;
}

std::string Program::autotune_report() const {
  std::string out;
  double best = 0, fallback = 0;
  for (int64_t k = 0; k < num_kernels(); ++k) {
    const KernelStep& step = kernels_[static_cast<size_t>(k)];
    if (!step.tuned) continue;
    const codegen::LaunchTuning& t = step.tuning.tuning;
    out += fmt::format("{:<40} {:>18} {:>10.1f} us {:>10.1f} us default\n", kernel_name(k),
                       t.block > 0 ? fmt::format("{} x {} max", t.block, t.max_grid) : std::string("default"),
                       step.tuning.best_us, step.tuning.default_us);
    best += step.tuning.best_us;
    fallback += step.tuning.default_us;
  }
  if (out.empty()) return "no kernel was tuned (max-autotune tunes CUDA kernels at their first run)\n";
  return out + fmt::format("{:<40} {:>18} {:>10.1f} us {:>10.1f} us default\n", "total", "", best, fallback);
}

std::string Program::kernel_name(int64_t k) const {
  const KernelStep& step = kernels_.at(static_cast<size_t>(k));
  return fmt::format("k{}_{}", k, steps_[static_cast<size_t>(step.step)].kernel.name);
}

std::string Program::kernel_ir(int64_t k) const {
  const KernelStep& step = kernels_.at(static_cast<size_t>(k));
  return codegen::print(steps_[static_cast<size_t>(step.step)].kernel);
}

const std::string& Program::kernel_source(int64_t k) const { return kernels_.at(static_cast<size_t>(k)).source; }

std::string Program::kernels_text() const {
  std::string out;
  for (int64_t k = 0; k < num_kernels(); ++k) out += fmt::format("# {}\n{}\n", kernel_name(k), kernel_ir(k));
  return out;
}

std::string Program::sources_text() const {
  std::string out;
  for (int64_t k = 0; k < num_kernels(); ++k)
    out += fmt::format("// ===== {} =====\n{}\n", kernel_name(k), kernel_source(k));
  return out;
}

std::string Program::describe() const {
  const Graph& g = graph_;
  int64_t ops = 0, eager = 0, views = 0;
  for (const Node& n : g.nodes()) ops += n.kind == NodeKind::op;
  for (const FusionGroup& s : steps_) {
    eager += s.kind == FusionGroup::eager;
    views += s.kind == FusionGroup::view;
  }
  std::string out = fmt::format("program: {} steps for {} op nodes: {} kernels, {} eager, {} views; planned peak ~{:.2f} MiB\n",
                                steps_.size(), ops, num_kernels(), eager, views,
                                static_cast<double>(planned_peak_bytes_) / 1048576.0);
  auto numbers = [&](const std::vector<int32_t>& nodes) {
    std::vector<std::string> text;
    for (int32_t n : nodes) text.push_back(fmt::format("%{}", g.value_number({n, 0})));
    return fmt::format("{}", fmt::join(text, " "));
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const FusionGroup& step = steps_[s];
    // "in place into %3": the write-back the step computes straight into its input.
    auto into = [&](int32_t input) {
      return fmt::format("%{}", g.value_number(g.inputs()[static_cast<size_t>(input)]));
    };
    if (step.is_kernel()) {
      std::vector<int32_t> stored;
      std::vector<std::string> in_place;
      const std::vector<int32_t> outs = step.kernel.output_buffers();
      std::vector<std::string> reused;
      const std::vector<int32_t> ins = step.kernel.input_buffers();
      for (size_t j = 0; j < outs.size(); ++j) {
        stored.push_back(step.kernel.buffers[static_cast<size_t>(outs[j])].node);
        if (in_place_outputs_[s][j] >= 0) in_place.push_back(into(in_place_outputs_[s][j]));
        if (!reuse_input_[s].empty() && reuse_input_[s][j] >= 0) {
          const codegen::Buffer& in = step.kernel.buffers[static_cast<size_t>(ins[static_cast<size_t>(reuse_input_[s][j])])];
          reused.push_back(fmt::format("%{}", g.value_number({in.node, in.output_index})));
        }
      }
      out += fmt::format("  {:<9} {} over {}: {} -> {}{}{}\n", kind_name(step.kind), kernel_name(kernel_of_[s]),
                         shape_str(step.kernel.shape), numbers(step.nodes), numbers(stored),
                         in_place.empty() ? "" : fmt::format(" (in place into {})", fmt::join(in_place, " ")),
                         reused.empty() ? "" : fmt::format(" (over {})", fmt::join(reused, " ")));
    } else {
      const Node& node = g.nodes()[static_cast<size_t>(step.nodes[0])];
      std::string in_place = in_place_op_[s] ? fmt::format(" (in place: {})", in_place_op_[s]->name) : "";
      if (in_place_eager_[s] >= 0) in_place = fmt::format(" (in place into {})", into(in_place_eager_[s]));
      out += fmt::format("  {:<9} {} {}{}\n", kind_name(step.kind), node.op, numbers(step.nodes), in_place);
    }
  }
  return out;
}

}  // namespace kiln::compiler
