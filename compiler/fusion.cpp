// fuse() (compiler/fusion.h): contiguous runs of pointwise nodes, a reduction with its
// private prologue, and eager and view steps between them.
#include "compiler/fusion.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "compiler/codegen/lower.h"
#include "core/error.h"

namespace kiln::compiler {

namespace {

class Fuser {
 public:
  explicit Fuser(const Graph& g) : g_(g), users_(g.nodes().size()), escapes_(g.nodes().size(), false) {
    for (size_t n = 0; n < g.nodes().size(); ++n)
      for (const Value& v : g.nodes()[n].inputs)
        if (v.defined()) users_[static_cast<size_t>(v.node)].push_back(static_cast<int32_t>(n));
    for (const Value& v : g.outputs()) escapes_[static_cast<size_t>(v.node)] = true;
    for (const auto& wb : g.write_backs()) escapes_[static_cast<size_t>(wb.second.node)] = true;
  }

  std::vector<ScheduleStep> run() {
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const auto n = static_cast<int32_t>(i);
      const Node& node = g_.nodes()[i];
      if (node.kind != NodeKind::op) continue;
      if (node.def->kind == OpKind::view) {
        if (!node.inputs.empty() && node.inputs[0].defined() && in_run_.contains(node.inputs[0].node)) flush();
        push({n}, ScheduleStep::view);
        continue;
      }
      if (!has_generated_target(node)) {
        flush();
        push({n}, ScheduleStep::eager);
        continue;
      }
      if (codegen::lowers_reduction(*node.def)) {
        reduction(n);
        continue;
      }
      const bool pointwise = codegen::lowers_pointwise(*node.def);
      if (pointwise && !run_.empty() && node.outputs.size() == 1 && node.outputs[0].shape == run_shape_) {
        std::vector<int32_t> candidate = run_;
        candidate.push_back(n);
        if (used_outside(candidate)) {
          run_ = std::move(candidate);
          in_run_.insert(n);
          continue;
        }
      }
      flush();
      if (pointwise && used_outside({n})) {
        run_ = {n};
        in_run_ = {n};
        run_shape_ = node.outputs[0].shape;
        continue;
      }
      push({n}, ScheduleStep::eager);
    }
    flush();
    return std::move(schedule_);
  }

 private:
  // The devices with a code generator: the CPU (C++) and CUDA GPUs (NVRTC).
  static bool has_generated_target(const Node& node) {
    return std::all_of(node.outputs.begin(), node.outputs.end(), [](const TensorType& t) {
      return !t.defined || t.device.is_cpu() || t.device.is_cuda();
    });
  }

  // Whether a value of `group` is used outside it (by a node, an output or a write-back):
  // a pointwise group of nodes that codegen::lowers_pointwise accepts, one shape for all,
  // is then one kernel (codegen::lower_pointwise), whose outputs those values are.
  bool used_outside(const std::vector<int32_t>& group) const {
    for (int32_t m : group) {
      if (escapes_[static_cast<size_t>(m)]) return true;
      for (int32_t u : users_[static_cast<size_t>(m)])
        if (std::find(group.begin(), group.end(), u) == group.end()) return true;
    }
    return false;
  }

  std::optional<codegen::Kernel> reduction_kernel(const std::vector<int32_t>& nodes) const {
    std::string refusal;
    return codegen::try_lower_reduction(g_, nodes, refusal);
  }

  void push(std::vector<int32_t> nodes, ScheduleStep::Kind kind, codegen::Kernel kernel = {}) {
    schedule_.push_back({std::move(nodes), kind, std::move(kernel)});
  }

  // Ends the current run: its kernel becomes a step.
  void flush() {
    if (run_.empty()) return;
    codegen::Kernel kernel = codegen::lower_pointwise(g_, run_);
    push(std::move(run_), ScheduleStep::pointwise, std::move(kernel));
    run_.clear();
    in_run_.clear();
  }

  // Reduction node r: fused with the run nodes only it reads (the run's other nodes stay a
  // pointwise kernel before it) when lower_reduction accepts that; else alone.
  void reduction(int32_t r) {
    const Node& red = g_.nodes()[static_cast<size_t>(r)];
    if (!run_.empty() && !red.inputs.empty() && in_run_.contains(red.inputs[0].node)) {
      // Backwards through the run: a node is private when it escapes nowhere and all its
      // users are private nodes or r (later nodes are decided first).
      std::set<int32_t> prologue;
      for (size_t i = run_.size(); i-- > 0;) {
        const int32_t m = run_[i];
        const std::vector<int32_t>& users = users_[static_cast<size_t>(m)];
        const bool private_node =
            !escapes_[static_cast<size_t>(m)] && !users.empty() &&
            std::all_of(users.begin(), users.end(), [&](int32_t u) { return u == r || prologue.contains(u); });
        if (private_node) prologue.insert(m);
      }
      if (!prologue.empty()) {
        std::vector<int32_t> rest, fused(prologue.begin(), prologue.end());
        for (int32_t m : run_)
          if (!prologue.contains(m)) rest.push_back(m);
        fused.push_back(r);
        if (rest.empty() || used_outside(rest)) {
          if (auto k = reduction_kernel(fused)) {
            if (!rest.empty()) {
              codegen::Kernel before = codegen::lower_pointwise(g_, rest);
              push(std::move(rest), ScheduleStep::pointwise, std::move(before));
            }
            push(std::move(fused), ScheduleStep::reduction, std::move(*k));
            run_.clear();
            in_run_.clear();
            return;
          }
        }
      }
    }
    flush();
    if (auto k = reduction_kernel({r}))
      push({r}, ScheduleStep::reduction, std::move(*k));
    else
      push({r}, ScheduleStep::eager);
  }

  const Graph& g_;
  std::vector<std::vector<int32_t>> users_;  // per node: the nodes reading its values
  std::vector<bool> escapes_;                // per node: a graph output or write-back
  std::vector<ScheduleStep> schedule_;
  std::vector<int32_t> run_;  // the current pointwise run
  std::set<int32_t> in_run_;
  Shape run_shape_;
};

}  // namespace

const char* kind_name(ScheduleStep::Kind kind) {
  switch (kind) {
    case ScheduleStep::pointwise: return "pointwise";
    case ScheduleStep::reduction: return "reduction";
    case ScheduleStep::eager: return "eager";
    case ScheduleStep::view: return "view";
  }
  return "?";
}

std::vector<ScheduleStep> fuse(const Graph& graph) { return Fuser(graph).run(); }

}  // namespace kiln::compiler
