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
      if (node.kind != NodeKind::op || converted_.contains(n)) continue;
      if (node.def->kind == OpKind::view) {
        if (!node.inputs.empty() && node.inputs[0].defined() && in_run_.contains(node.inputs[0].node)) flush();
        push({n}, ScheduleStep::view);
        continue;
      }
      if (!has_generated_target(node)) {
        flush();
        push_eager(n);
        continue;
      }
      if (codegen::lowers_reduction(*node.def)) {
        reduction(n);
        continue;
      }
      if (!run_.empty() && runs_beside(node)) {
        push_eager(n);
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
      push_eager(n);
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

  // Whether library node `node` may run before the current run's kernel, leaving the run
  // open: batch norm's statistics ops (compiler/passes/batch_norm_split.cpp) when they read
  // no value of the run. Their pointwise consumers (batch norm's apply, its input gradient)
  // then join the run: ReLU's backward mask, which the gradient sums read through its
  // inputs, is one more line of the input gradient's kernel instead of a stored tensor.
  bool runs_beside(const Node& node) const {
    if (node.op != "batch_norm_grad_stats" && node.op != "batch_norm_train_stats") return false;
    return std::none_of(node.inputs.begin(), node.inputs.end(),
                        [&](const Value& v) { return v.defined() && in_run_.contains(v.node); });
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

  // An eager step for node n, with the cast of its result when the library call can write
  // that itself (fusion.h, "eager").
  void push_eager(int32_t n) {
    if (const int32_t c = result_cast(n); c >= 0) {
      converted_.insert(c);
      push({n, c}, ScheduleStep::eager);
      return;
    }
    push({n}, ScheduleStep::eager);
  }

  // The cast node that alone reads library node n's one result, or -1. Only ops autocast
  // lowers (GEMMs and convolutions, whose kernels compute in f32 or f64 and convert as they
  // store); and not when a pointwise op reads the cast, whose kernel converts for free.
  int32_t result_cast(int32_t n) const {
    const Node& node = g_.nodes()[static_cast<size_t>(n)];
    if (node.def->cast_policy != CastPolicy::lower || node.outputs.size() != 1 || escapes_[static_cast<size_t>(n)])
      return -1;
    const std::vector<int32_t>& users = users_[static_cast<size_t>(n)];
    if (users.size() != 1) return -1;
    const Node& cast = g_.nodes()[static_cast<size_t>(users[0])];
    if (cast.def->elementwise != Elementwise::convert || cast.inputs.size() != 1 ||
        cast.outputs[0].dtype == node.outputs[0].dtype || cast.outputs[0].shape != node.outputs[0].shape)
      return -1;
    for (int32_t u : users_[static_cast<size_t>(users[0])])
      if (codegen::lowers_pointwise(*g_.nodes()[static_cast<size_t>(u)].def)) return -1;
    return users[0];
  }

  void push(std::vector<int32_t> nodes, ScheduleStep::Kind kind, codegen::Kernel kernel = {}) {
    schedule_.push_back({std::move(nodes), kind, std::move(kernel)});
  }

  // Ends the current run: its kernel becomes a step (or part of the reduction's before it).
  void flush() {
    if (run_.empty()) return;
    if (!join_reduction()) {
      codegen::Kernel kernel = codegen::lower_pointwise(g_, run_);
      push(std::move(run_), ScheduleStep::pointwise, std::move(kernel));
    }
    run_.clear();
    in_run_.clear();
  }

  // A run of dtype conversions over the input space of the reduction step just before it
  // (view steps between), reading only values that exist before that step, is stored by the
  // reduction's kernel as it walks those elements (side outputs, codegen::lower_reduction):
  // one pass over the memory instead of two. That is the f32 logits gradient cast to bf16 for
  // the classifier's GEMMs, which the bias gradient's sum reads in f32. Only conversions: a
  // reduction kernel runs in parallel over its kept indices alone, so larger work stays in
  // pointwise kernels.
  bool join_reduction() {
    size_t s = schedule_.size();
    while (s > 0 && schedule_[s - 1].kind == ScheduleStep::view) --s;
    if (s == 0 || schedule_[s - 1].kind != ScheduleStep::reduction) return false;
    ScheduleStep& step = schedule_[s - 1];
    const int32_t first = step.nodes.front();
    if (!only_conversions()) return false;
    for (int32_t m : run_) {
      const Node& node = g_.nodes()[static_cast<size_t>(m)];
      for (Value v : node.inputs) {
        // The memory the kernel loads: the value behind any views.
        const Node* from = v.defined() ? &g_.node(v) : nullptr;
        while (from && from->kind == NodeKind::op && from->def->kind == OpKind::view) {
          v = from->inputs.at(0);
          from = &g_.node(v);
        }
        if (from && from->kind == NodeKind::op && !in_run_.contains(v.node) && v.node >= first) return false;
      }
    }
    std::vector<int32_t> nodes = step.nodes;
    nodes.insert(nodes.end(), run_.begin(), run_.end());
    std::optional<codegen::Kernel> k = reduction_kernel(nodes);
    if (!k) return false;
    step.nodes = std::move(nodes);
    step.kernel = std::move(*k);
    return true;
  }

  // Whether the run is dtype conversions only (a layout copy, a clone, keeps its pointwise
  // kernel).
  bool only_conversions() const {
    return std::all_of(run_.begin(), run_.end(), [&](int32_t m) {
      const Node& node = g_.nodes()[static_cast<size_t>(m)];
      return node.def->elementwise == Elementwise::convert &&
             g_.type(node.inputs.at(0)).dtype != node.outputs[0].dtype;
    });
  }

  // Reduction node r: fused with the run nodes only it reads (the run's other nodes stay a
  // pointwise kernel before it) when lower_reduction accepts that; else, when the run is
  // conversions that r reads and others read too, with them as side outputs the kernel
  // stores as it walks them (the logits gradient cast to bf16 for a Linear's GEMMs under
  // autocast, which the bias gradient's sum reads in bf16); else alone.
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
    if (!run_.empty() && !red.inputs.empty() && in_run_.contains(red.inputs[0].node) && only_conversions()) {
      std::vector<int32_t> nodes = run_;
      nodes.push_back(r);
      if (auto k = reduction_kernel(nodes)) {
        push(std::move(nodes), ScheduleStep::reduction, std::move(*k));
        run_.clear();
        in_run_.clear();
        return;
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
  std::set<int32_t> converted_;              // casts an eager step before them took along
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

CastSteps stand_alone_casts(const Graph& graph, const std::vector<ScheduleStep>& schedule) {
  CastSteps casts;
  for (size_t s = 0; s < schedule.size(); ++s) {
    const ScheduleStep& step = schedule[s];
    if (step.kind == ScheduleStep::view || step.nodes.empty()) continue;
    bool converts_only = true, changes_dtype = false, reads_computed = false;
    for (int32_t n : step.nodes) {
      const Node& node = graph.nodes()[static_cast<size_t>(n)];
      if (node.def->elementwise != Elementwise::convert) {
        converts_only = false;
        break;
      }
      Value source = node.inputs.at(0);
      changes_dtype |= graph.type(source).dtype != node.outputs[0].dtype;
      // Through views to the memory the cast reads: a graph input's, or a step's result.
      const Node* from = &graph.node(source);
      while (from->kind == NodeKind::op && from->def->kind == OpKind::view) {
        source = from->inputs.at(0);
        from = &graph.node(source);
      }
      const bool in_step = std::find(step.nodes.begin(), step.nodes.end(), source.node) != step.nodes.end();
      reads_computed |= from->kind == NodeKind::op && !in_step;
    }
    if (!converts_only || !changes_dtype) continue;
    (reads_computed ? casts.of_computed : casts.of_inputs).push_back(s);
  }
  return casts;
}

}  // namespace kiln::compiler
