// What a Program (compiler/program.h) says about itself: its schedule, kernels and sources
// for the dumps, why it cannot be captured as a CUDA graph, its profile and its autotune
// report. Running it is compiler/program.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "compiler/program.h"

namespace kiln::compiler {

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
    const ScheduleStep& step = steps_[s];
    if (step.is_kernel()) {
      const Device device = kernels_[static_cast<size_t>(kernel_of_[s])].built.device;
      if (device != Device::cuda(gpu_)) return fmt::format("kernel {} runs on {}", step.kernel.name, device);
      continue;
    }
    for (int32_t n : step.nodes) {  // an eager step's op, and the cast of its result
      const Node& node = g.nodes()[static_cast<size_t>(n)];
      for (Value v : node.inputs)
        if (v.defined() && g.type(v).device != Device::cuda(gpu_))
          return fmt::format("{} reads a tensor on {} (%{})", node.op, g.type(v).device, g.value_number(v));
      for (const TensorType& t : node.outputs)
        if (t.defined && t.device != Device::cuda(gpu_)) return fmt::format("{} makes a tensor on {}", node.op, t.device);
    }
  }
  return {};
}

void Program::set_profiling(bool on) {
  profiling_ = on;
  step_ms_.assign(steps_.size(), 0.0);
  profiled_runs_ = 0;
  first_run_dropped_ = false;
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
    const ScheduleStep& step = steps_[s];
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
  out += fmt::format("{:<40} {:>10.3f} {:>6.1f}% {:>6}   ({} run{}{})\n", "total", total, 100.0, steps_.size(),
                     profiled_runs_, profiled_runs_ == 1 ? "" : "s", first_run_dropped_ ? " after the first" : "");
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

const std::string& Program::kernel_source(int64_t k) const { return kernels_.at(static_cast<size_t>(k)).built.source; }

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
  for (const ScheduleStep& s : steps_) {
    eager += s.kind == ScheduleStep::eager;
    views += s.kind == ScheduleStep::view;
  }
  std::string out = fmt::format("program: {} steps for {} op nodes: {} kernels, {} eager, {} views; planned peak ~{:.2f} MiB\n",
                                steps_.size(), ops, num_kernels(), eager, views,
                                static_cast<double>(plan_.peak_bytes) / 1048576.0);
  auto numbers = [&](const std::vector<int32_t>& nodes) {
    std::vector<std::string> text;
    for (int32_t n : nodes) text.push_back(fmt::format("%{}", g.value_number({n, 0})));
    return fmt::format("{}", fmt::join(text, " "));
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const ScheduleStep& step = steps_[s];
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
        if (plan_.in_place_outputs[s][j] >= 0) in_place.push_back(into(plan_.in_place_outputs[s][j]));
        if (const std::vector<int32_t>& reuse = plan_.reuse_input[s]; !reuse.empty() && reuse[j] >= 0) {
          const codegen::Buffer& in = step.kernel.buffers[static_cast<size_t>(ins[static_cast<size_t>(reuse[j])])];
          reused.push_back(fmt::format("%{}", g.value_number({in.node, in.output_index})));
        }
      }
      out += fmt::format("  {:<9} {} over {}: {} -> {}{}{}\n", kind_name(step.kind), kernel_name(kernel_of_[s]),
                         shape_str(step.kernel.shape), numbers(step.nodes), numbers(stored),
                         in_place.empty() ? "" : fmt::format(" (in place into {})", fmt::join(in_place, " ")),
                         reused.empty() ? "" : fmt::format(" (over {})", fmt::join(reused, " ")));
    } else {
      const Node& node = g.nodes()[static_cast<size_t>(step.nodes[0])];
      const std::string converted =
          step.converts_result()
              ? fmt::format(" (as {})", g.nodes()[static_cast<size_t>(step.result_node())].outputs[0].dtype)
              : "";
      std::string in_place = plan_.in_place_op[s] ? fmt::format(" (in place: {})", plan_.in_place_op[s]->name) : "";
      if (plan_.in_place_eager[s] >= 0) in_place = fmt::format(" (in place into {})", into(plan_.in_place_eager[s]));
      out += fmt::format("  {:<9} {} {}{}{}\n", kind_name(step.kind), node.op, numbers(step.nodes), converted,
                         in_place);
    }
  }
  return out;
}

}  // namespace kiln::compiler
