// The GPU cost model (compiler/cost.h).
#include "compiler/cost.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "compiler/codegen/lower.h"
#include "core/error.h"
#include "core/ops/conv.h"

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

// The tensor-core (or CUDA-core) rate products of this dtype run at.
double product_rate(DType t, const GpuSpec& gpu, const CostOptions& o) {
  if (is_reduced_float(t)) return gpu.bf16_flops;
  if (t == DType::f32 && o.tf32) return gpu.tf32_flops;
  return gpu.fp32_flops;
}

bool is_product(const std::string& op) {
  return op == "mm" || op == "matmul" || op == "bmm" || op == "addmm" || op == "linear" || op == "baddbmm";
}

// What a library call adds to its operands and results on CUDA, and its FLOPs.
void add_library_costs(const Graph& g, const Node& n, StepCost& c, const GpuSpec& gpu, const CostOptions& o,
                       double& rate) {
  const std::string& op = n.op;
  rate = gpu.fp32_flops;
  c.flops = static_cast<double>(numel_of(n.outputs[0].shape));
  if (op == "conv2d" || op == "conv2d_backward_input" || op == "conv2d_backward_weight") {
    // Multiply-adds: each output-shaped element times the weight's reduction size.
    const TensorType& y = op == "conv2d" ? n.outputs[0] : g.type(n.inputs[0]);
    const TensorType& w = op == "conv2d_backward_weight" ? n.outputs[0] : g.type(n.inputs[1]);
    c.flops = 2.0 * static_cast<double>(numel_of(y.shape)) * static_cast<double>(numel_of(w.shape)) /
              static_cast<double>(std::max<int64_t>(1, w.shape.at(0)));
    rate = product_rate(y.dtype, gpu, o);
    const TensorType& activation = op == "conv2d_backward_weight" ? g.type(n.inputs[1]) : g.type(n.inputs[0]);
    const bool tensor_cores = rate != gpu.fp32_flops;
    if (tensor_cores && activation.layout != MemoryFormat::channels_last && activation.shape.size() == 4) {
      // cuDNN's tensor-core kernels are NHWC: an NCHW call transposes its activation in
      // and its activation-shaped result (or gradient) out.
      const int64_t in = bytes_of(activation);
      const int64_t out = op == "conv2d_backward_weight" ? bytes_of(g.type(n.inputs[0])) : bytes_of(n.outputs[0]);
      c.bytes_read += in + out;
      c.bytes_written += in + out;
      c.launches += 2;
      c.note = "nchw: transposes in and out";
    }
    return;
  }
  if (is_product(op)) {
    const Shape& a = g.type(n.inputs[op == "addmm" || op == "baddbmm" ? 1 : 0]).shape;
    c.flops = 2.0 * static_cast<double>(numel_of(n.outputs[0].shape)) * static_cast<double>(a.empty() ? 1 : a.back());
    rate = product_rate(n.outputs[0].dtype, gpu, o);
    return;
  }
  const bool reduced = !n.inputs.empty() && n.inputs[0].defined() && is_reduced_float(g.type(n.inputs[0]).dtype);
  if (op == "batch_norm" || op == "batch_norm_stats_update") {
    const int64_t elements = numel_of(g.type(n.inputs[0]).shape), f32 = elements * 4;
    const bool forward = op == "batch_norm";
    // cuDNN reads x once for the statistics and once to normalize. 16-bit x is converted
    // to an f32 copy first (which cuDNN reads twice) and y converted back from f32. The
    // statistics update reruns the forward on copies and writes a y it throws away.
    if (reduced) {
      c.bytes_written += f32 + (forward ? f32 : 0);
      c.bytes_read += 2 * f32 + (forward ? f32 : 0);
      c.launches += forward ? 2 : 1;
      c.note = "16-bit: converted to f32 and back";
    } else {
      c.bytes_read += bytes_of(g.type(n.inputs[0]));
    }
    if (!forward) {
      c.bytes_written += reduced ? f32 : bytes_of(g.type(n.inputs[0]));
      c.launches += 2;  // the copies of the running statistics
      c.note += c.note.empty() ? "reruns the forward" : "; reruns the forward";
    }
    c.flops = 8.0 * static_cast<double>(elements);
    return;
  }
  if (op == "batch_norm_backward") {
    const Value dy = n.inputs[0], x = n.inputs[1];
    const int64_t elements = numel_of(g.type(x).shape), f32 = elements * 4;
    // Two passes over x and dy: the reductions of dy and dy (x - mean), then dx. 16-bit x
    // and dy are converted to f32 copies (read twice), dx converted back.
    if (reduced) {
      c.bytes_written += 2 * f32 + f32;
      c.bytes_read += 4 * f32 + f32;
      c.launches += 3;
      c.note = "16-bit: converted to f32 and back";
    } else {
      c.bytes_read += bytes_of(g.type(dy)) + bytes_of(g.type(x));
    }
    c.flops = 10.0 * static_cast<double>(elements);
    return;
  }
  if (op == "sgd_update_multi" || op == "adamw_update_multi" || op == "adam_update_multi") {
    const int64_t count = n.attrs.has("count") ? n.attrs.i("count") : 1;
    const int64_t group = op == "sgd_update_multi" ? 24 : 16;  // kernels/cuda/optim.h's tables
    c.launches = std::max<int64_t>(1, (count + group - 1) / group);
    c.flops = 0;
    for (const TensorType& t : n.outputs) c.flops += 4.0 * static_cast<double>(numel_of(t.shape));
  }
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
      add_library_costs(g, first, c, gpu, o, rate);
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
