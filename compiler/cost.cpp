// The GPU cost model (compiler/cost.h).
#include "compiler/cost.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "compiler/codegen/lower.h"
#include "core/error.h"

namespace kiln::compiler {

const std::vector<GpuSpec>& gpu_specs() {
  // NVIDIA's data sheets, SXM parts, dense tensor-core rates (half the "with sparsity"
  // figures). The launch cost is the usual few microseconds a host spends per launch.
  static const std::vector<GpuSpec> specs = {
      {"h200", "NVIDIA H200 SXM, 141 GB HBM3e", 4.8e12, 67e12, 494.7e12, 989.5e12, 2.5e-6},
      {"h100", "NVIDIA H100 SXM, 80 GB HBM3", 3.35e12, 67e12, 494.7e12, 989.5e12, 2.5e-6},
      {"a100", "NVIDIA A100 SXM, 80 GB HBM2e", 2.039e12, 19.5e12, 156e12, 312e12, 2.5e-6},
  };
  return specs;
}

const GpuSpec& gpu_spec(std::string_view name) {
  std::string known;
  for (const GpuSpec& s : gpu_specs()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  fail("gpu_spec: unknown GPU '{}' (known: {})", name, known);
}

namespace {

int64_t bytes_of(const TensorType& t) {
  return t.defined ? numel_of(t.shape) * static_cast<int64_t>(itemsize(t.dtype)) : 0;
}

bool is_view(const Node& n) { return n.kind == NodeKind::op && n.def && n.def->kind == OpKind::view; }

// Ops a generated kernel computes (so perfect fusion keeps their values in registers).
bool fusable(const Node& n) {
  return n.kind == NodeKind::op && n.def && (codegen::lowers_pointwise(*n.def) || codegen::lowers_reduction(*n.def));
}

// Everything the model needs to know about the graph's values.
struct Uses {
  std::vector<std::vector<int32_t>> readers;  // per node: the op nodes reading any of its values
  std::set<Value> escapes;                    // graph outputs and written-back values
};

Uses uses_of(const Graph& g) {
  Uses u;
  u.readers.resize(g.nodes().size());
  for (size_t n = 0; n < g.nodes().size(); ++n)
    for (const Value in : g.nodes()[n].inputs)
      if (in.defined()) u.readers[static_cast<size_t>(in.node)].push_back(static_cast<int32_t>(n));
  for (const Value v : g.outputs()) u.escapes.insert(v);
  for (const auto& [input, value] : g.write_backs()) u.escapes.insert(value);
  return u;
}

// The value a chain of views reads, and the bytes reading v costs: a broadcast or a slice
// reads no more than the value under it, nor more than itself.
Value base_of(const Graph& g, Value v) {
  while (v.defined() && is_view(g.node(v)) && !g.node(v).inputs.empty()) v = g.node(v).inputs[0];
  return v;
}
int64_t read_bytes(const Graph& g, Value v) { return std::min(bytes_of(g.type(v)), bytes_of(g.type(base_of(g, v)))); }

// The rate a library call's FLOPs run at: tensor cores in its math dtype, else CUDA cores.
double rate_of(const GpuWork& w, const GpuSpec& gpu) {
  if (!w.tensor_cores) return gpu.fp32_flops;
  return is_reduced_float(w.math) ? gpu.bf16_flops : gpu.tf32_flops;
}

}  // namespace

CostReport estimate_cost(const Graph& g, const std::vector<ScheduleStep>& schedule, const GpuSpec& gpu,
                         const CostOptions& o) {
  const Uses u = uses_of(g);
  std::vector<int32_t> step_of(g.nodes().size(), -1);
  for (size_t s = 0; s < schedule.size(); ++s)
    for (int32_t n : schedule[s].nodes) step_of[static_cast<size_t>(n)] = static_cast<int32_t>(s);

  CostReport r;
  r.gpu = gpu.name;
  for (size_t s = 0; s < schedule.size(); ++s) {
    const ScheduleStep& step = schedule[s];
    StepCost c;
    c.step = s;
    const Node& first = g.nodes()[static_cast<size_t>(step.nodes.front())];
    if (step.kind == ScheduleStep::view) {
      c.kind = "view";
      c.name = first.op;
      r.steps.push_back(std::move(c));
      continue;
    }
    c.kind = step.is_kernel() ? kind_name(step.kind) : "library";
    c.name = step.is_kernel() ? step.kernel.name : first.op;
    c.launches = 1;
    // Reads: each value from outside the step once; writes: each value used after it.
    std::set<Value> read;
    for (int32_t n : step.nodes)
      for (const Value in : g.nodes()[static_cast<size_t>(n)].inputs)
        if (in.defined() && step_of[static_cast<size_t>(in.node)] != static_cast<int32_t>(s) && read.insert(in).second)
          c.bytes_read += read_bytes(g, in);
    for (int32_t n : step.nodes) {
      const Node& node = g.nodes()[static_cast<size_t>(n)];
      for (size_t k = 0; k < node.outputs.size(); ++k) {
        const Value v{n, static_cast<int32_t>(k)};
        bool used_after = u.escapes.count(v) > 0;
        for (int32_t reader : u.readers[static_cast<size_t>(n)]) {
          if (step_of[static_cast<size_t>(reader)] == static_cast<int32_t>(s)) continue;
          const auto& ins = g.nodes()[static_cast<size_t>(reader)].inputs;
          used_after = used_after || std::find(ins.begin(), ins.end(), v) != ins.end();
        }
        if (used_after) c.bytes_written += bytes_of(node.outputs[k]);
      }
    }
    double rate = gpu.fp32_flops;
    if (step.is_kernel()) {
      c.flops = 0;
      for (int32_t n : step.nodes) {
        const Node& node = g.nodes()[static_cast<size_t>(n)];
        const Shape& space = node.inputs.empty() || !node.inputs[0].defined() || node.def->reduction == Reduction::none
                                 ? node.outputs[0].shape
                                 : g.type(node.inputs[0]).shape;
        c.flops += static_cast<double>(numel_of(space));
      }
    } else {
      std::vector<TensorMeta> in, out;
      for (const Value v : first.inputs) in.push_back(v.defined() ? g.type(v).meta() : TensorMeta{.defined = false});
      for (const TensorType& t : first.outputs) out.push_back(t.meta());
      const GpuWork w = first.def->gpu_work ? first.def->gpu_work(in, out, first.attrs, o.tf32) : GpuWork{};
      c.flops = w.flops >= 0 ? w.flops : static_cast<double>(numel_of(first.outputs[0].shape));
      c.bytes_read += w.extra_read;
      c.bytes_written += w.extra_written;
      c.launches = w.launches;
      c.note = w.note;
      rate = rate_of(w, gpu);
    }
    const double memory_s = static_cast<double>(c.bytes_read + c.bytes_written) / gpu.memory_bytes_per_s;
    const double compute_s = c.flops / rate;
    c.seconds = std::max(memory_s, compute_s);
    c.compute_bound = compute_s > memory_s;
    r.bytes += c.bytes_read + c.bytes_written;
    r.flops += c.flops;
    r.launches += c.launches;
    r.groups += 1;
    r.seconds += c.seconds;
    r.steps.push_back(std::move(c));
  }
  r.launch_s = static_cast<double>(r.launches) * gpu.launch_s;

  // The minimum traffic: values that must be in memory, written once and read once per
  // library op plus once by the generated work.
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const Node& node = g.nodes()[n];
    if (is_view(node)) continue;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const Value v{static_cast<int32_t>(n), static_cast<int32_t>(k)};
      // Who reads v, through views: library ops one by one, generated work as one.
      std::set<int32_t> library_readers;
      bool fused_reader = false;
      std::vector<Value> frontier = {v};
      while (!frontier.empty()) {
        const Value at = frontier.back();
        frontier.pop_back();
        for (int32_t reader : u.readers[static_cast<size_t>(at.node)]) {
          const Node& rn = g.nodes()[static_cast<size_t>(reader)];
          if (std::find(rn.inputs.begin(), rn.inputs.end(), at) == rn.inputs.end()) continue;
          if (is_view(rn)) frontier.push_back({reader, 0});
          else if (fusable(rn)) fused_reader = true;
          else library_readers.insert(reader);
        }
      }
      const bool escapes = u.escapes.count(v) > 0;
      const bool made_by_library = node.kind == NodeKind::op && !fusable(node);
      const bool must_exist = escapes || !library_readers.empty() || made_by_library ||
                              (node.kind == NodeKind::input && fused_reader);
      if (!must_exist) continue;
      const int64_t b = bytes_of(node.outputs[k]);
      if (node.kind == NodeKind::op) r.minimum_bytes += b;
      r.minimum_bytes += b * (static_cast<int64_t>(library_readers.size()) + (fused_reader ? 1 : 0));
    }
  }
  return r;
}

std::string cost_table(const CostReport& r) {
  size_t width = 8;
  for (const StepCost& c : r.steps)
    if (c.kind != "view") width = std::max(width, c.name.size());
  width = std::min<size_t>(width, 48);
  std::string out = fmt::format("{:>5}  {:<{}}  {:<9}  {:>10}  {:>10}  {:>9}  {:>3}  {:>8}  {:<7}  {}\n", "step", "name",
                                width, "kind", "read MB", "write MB", "GFLOP", "lch", "us", "bound", "note");
  struct Sum {
    int64_t steps = 0, bytes = 0, launches = 0;
    double flops = 0, seconds = 0;
  };
  std::map<std::string, Sum> by_kind;
  for (const StepCost& c : r.steps) {
    if (c.kind == "view") continue;
    out += fmt::format("{:>5}  {:<{}}  {:<9}  {:>10.3f}  {:>10.3f}  {:>9.3f}  {:>3}  {:>8.1f}  {:<7}  {}\n", c.step,
                       c.name.substr(0, width), width, c.kind, c.bytes_read / 1e6, c.bytes_written / 1e6,
                       c.flops / 1e9, c.launches, c.seconds * 1e6, c.compute_bound ? "compute" : "memory", c.note);
    Sum& s = by_kind[c.kind == "library" ? "library " + c.name : c.kind];
    ++s.steps;
    s.bytes += c.bytes_read + c.bytes_written;
    s.launches += c.launches;
    s.flops += c.flops;
    s.seconds += c.seconds;
  }
  out += fmt::format("\nper kind on {}:\n{:<36}  {:>5}  {:>10}  {:>9}  {:>5}  {:>9}\n", r.gpu, "kind", "steps", "MB",
                     "GFLOP", "lch", "ms");
  for (const auto& [kind, s] : by_kind)
    out += fmt::format("{:<36}  {:>5}  {:>10.1f}  {:>9.1f}  {:>5}  {:>9.3f}\n", kind, s.steps, s.bytes / 1e6,
                       s.flops / 1e9, s.launches, s.seconds * 1e3);
  out += fmt::format(
      "total: {:.1f} MB planned against {:.1f} MB minimum ({:.2f}x), {:.1f} GFLOP, {} launches for {} groups "
      "({:.2f}x); roofline {:.3f} ms, launches {:.3f} ms\n",
      r.bytes / 1e6, r.minimum_bytes / 1e6, r.traffic_ratio(), r.flops / 1e9, r.launches, r.groups, r.launch_ratio(),
      r.seconds * 1e3, r.launch_s * 1e3);
  return out;
}

std::string cost_json_fields(const CostReport& r) {
  return fmt::format(
      R"("gpu":"{}","roofline_ms":{:.3f},"launch_ms":{:.3f},"planned_mb":{:.1f},"minimum_mb":{:.1f},)"
      R"("traffic_ratio":{:.3f},"gflop":{:.1f},"launches":{},"groups":{},"launch_ratio":{:.3f})",
      r.gpu, r.seconds * 1e3, r.launch_s * 1e3, r.bytes / 1e6, r.minimum_bytes / 1e6, r.traffic_ratio(), r.flops / 1e9,
      r.launches, r.groups, r.launch_ratio());
}

}  // namespace kiln::compiler
