// The memory plan (compiler/passes/memory_plan.h): liveness, in-place write-backs, buffer
// reuse and the peak over a fused schedule.
#include "compiler/passes/memory_plan.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

namespace kiln::compiler {

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

// Releases: per output, not per node: batch_norm_backward's input gradient dies at the next
// step while its weight and bias gradients are outputs (held per node, ResNet-50's backward
// kept one activation per layer too many, 26 MiB at batch 8).
void plan_releases(const Graph& graph, const std::vector<ScheduleStep>& steps, MemoryPlan& plan) {
  constexpr int32_t kKeep = std::numeric_limits<int32_t>::max();
  const std::vector<Node>& nodes = graph.nodes();
  // Per node, per output: the last step that reads it, and the step that makes it.
  std::vector<std::vector<int32_t>> last_use(nodes.size());
  std::vector<int32_t> defined_at(nodes.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n) last_use[n].assign(nodes[n].outputs.size(), -1);
  auto slot = [&](Value v) -> int32_t& { return last_use.at(static_cast<size_t>(v.node)).at(static_cast<size_t>(v.output)); };
  auto use = [&](Value v, int32_t step) {
    if (v.defined() && slot(v) != kKeep) slot(v) = step;
  };
  for (Value v : graph.outputs()) slot(v) = kKeep;
  for (const auto& [input, value] : graph.write_backs()) {
    slot(input) = kKeep;
    slot(value) = kKeep;
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto step = static_cast<int32_t>(s);
    const ScheduleStep& group = steps[s];
    if (group.is_kernel()) {
      for (int32_t b : group.kernel.input_buffers()) {
        const codegen::Buffer& in = group.kernel.buffers[static_cast<size_t>(b)];
        use({in.node, in.output_index}, step);
      }
      for (int32_t b : group.kernel.output_buffers())
        defined_at[static_cast<size_t>(group.kernel.buffers[static_cast<size_t>(b)].node)] = step;
    } else {
      // An eager step that converts its result reads only its op's inputs; the op's own
      // result never exists apart from the cast's (fusion.h).
      for (Value v : nodes[static_cast<size_t>(group.nodes.at(0))].inputs) use(v, step);
      for (int32_t n : group.nodes) defined_at[static_cast<size_t>(n)] = step;
    }
  }
  plan.release_after.assign(steps.size(), {});
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].kind != NodeKind::op) continue;
    for (size_t o = 0; o < last_use[n].size(); ++o) {
      const int32_t last = last_use[n][o];
      if (last == kKeep) continue;
      const int32_t after = last >= 0 ? std::max(last, defined_at[n]) : defined_at[n];
      if (after >= 0)
        plan.release_after[static_cast<size_t>(after)].push_back({static_cast<int32_t>(n), static_cast<int32_t>(o)});
    }
  }
}

// In-place write-backs (the plan's first rule), given the releases.
void plan_in_place(const Graph& graph, const std::vector<ScheduleStep>& steps, MemoryPlan& plan) {
  const std::vector<Node>& nodes = graph.nodes();
  const auto num_inputs = static_cast<int32_t>(graph.inputs().size());
  std::unordered_map<int32_t, int32_t> input_of_node;  // input node -> its index in inputs()
  for (int32_t i = 0; i < num_inputs; ++i) input_of_node[graph.inputs()[static_cast<size_t>(i)].node] = i;
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
  for (size_t s = 0; s < steps.size(); ++s) {
    const ScheduleStep& group = steps[s];
    if (group.is_kernel()) {
      for (int32_t b : group.kernel.input_buffers())
        read(group.kernel.buffers[static_cast<size_t>(b)].node, static_cast<int32_t>(s));
    } else {
      for (Value v : nodes[static_cast<size_t>(group.nodes.at(0))].inputs)
        if (v.defined()) read(v.node, static_cast<int32_t>(s));
    }
  }
  for (Value v : graph.outputs()) read(v.node, kAfterAll);
  // Which input each written-back value goes to (values written back twice: none).
  std::map<std::pair<int32_t, int32_t>, int32_t> target_of;
  for (const auto& [input, value] : graph.write_backs()) {
    const auto key = std::pair{value.node, value.output};
    const auto i = input_of_node.at(input.node);
    const auto [it, inserted] = target_of.emplace(key, i);
    if (!inserted) it->second = -1;
  }
  auto target = [&](int32_t node, int32_t output) {
    auto it = target_of.find({node, output});
    return it == target_of.end() ? -1 : it->second;
  };

  plan.in_place_outputs.assign(steps.size(), {});
  plan.in_place_op.assign(steps.size(), nullptr);
  plan.in_place_eager.assign(steps.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto step = static_cast<int32_t>(s);
    const ScheduleStep& group = steps[s];
    if (group.is_kernel()) {
      const codegen::Kernel& k = group.kernel;
      std::vector<int32_t>& into = plan.in_place_outputs[s];
      for (int32_t ob : k.output_buffers()) {
        const codegen::Buffer& out = k.buffers[static_cast<size_t>(ob)];
        const int32_t i = target(out.node, out.output_index);
        bool ok = i >= 0 && last_read[static_cast<size_t>(i)] <= step;
        // Read by this kernel too: only at the element it writes (no view, same walk).
        for (int32_t ib : k.input_buffers()) {
          const codegen::Buffer& in = k.buffers[static_cast<size_t>(ib)];
          if (ok && input_behind(in.node) == i) ok = in.views.empty() && in.dim_of == out.dim_of;
        }
        into.push_back(ok ? i : -1);
      }
      continue;
    }
    if (group.kind != ScheduleStep::eager) continue;
    const Node& node = nodes[static_cast<size_t>(group.nodes.at(0))];
    if (node.outputs.size() == 1) {
      const int32_t i = target(group.result_node(), 0);
      if (i >= 0 && last_read[static_cast<size_t>(i)] < step) {
        plan.in_place_eager[s] = i;
        continue;
      }
      // The rules below write the op's own result, not a converted one.
      if (group.converts_result()) continue;
      // An op adding its result to the input it writes back to (gemm_epilogues: grad +
      // mm(a, b), grad + a convolution's weight gradient) reads that input only at the
      // element it writes, so it may run in place when no other operand reads the input.
      const int acc = accumulator_input(node, graph);
      bool in_place = i >= 0 && acc >= 0 && last_read[static_cast<size_t>(i)] <= step &&
                      node.inputs[static_cast<size_t>(acc)].node == graph.inputs()[static_cast<size_t>(i)].node;
      for (size_t k = 0; k < node.inputs.size() && in_place; ++k)
        in_place = static_cast<int>(k) == acc || !node.inputs[k].defined() || input_behind(node.inputs[k].node) != i;
      if (in_place) {
        plan.in_place_eager[s] = i;
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
    if (ok && output == node.outputs.size()) plan.in_place_op[s] = twin;
  }
}

// Buffer reuse (the plan's second rule), given the releases and the in-place outputs.
void plan_reuse(const Graph& graph, const std::vector<ScheduleStep>& steps, MemoryPlan& plan) {
  const std::vector<Node>& nodes = graph.nodes();
  plan.reuse_input.assign(steps.size(), {});
  for (size_t s = 0; s < steps.size(); ++s) {
    const ScheduleStep& group = steps[s];
    if (group.kind != ScheduleStep::pointwise) continue;
    const codegen::Kernel& k = group.kernel;
    const std::vector<int32_t> ins = k.input_buffers(), outs = k.output_buffers();
    std::vector<int32_t>& reuse = plan.reuse_input[s];
    reuse.assign(outs.size(), -1);
    std::vector<bool> taken(ins.size(), false);
    for (size_t j = 0; j < outs.size(); ++j) {
      if (plan.in_place_outputs[s][j] >= 0) continue;  // computed into a graph input already
      const codegen::Buffer& out = k.buffers[static_cast<size_t>(outs[j])];
      const TensorType& type = nodes[static_cast<size_t>(out.node)].outputs.at(static_cast<size_t>(out.output_index));
      for (size_t r = 0; r < ins.size() && reuse[j] < 0; ++r) {
        const codegen::Buffer& in = k.buffers[static_cast<size_t>(ins[r])];
        const Value v{in.node, in.output_index};
        const Node& maker = nodes[static_cast<size_t>(in.node)];
        const std::vector<Value>& dying = plan.release_after[s];
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
        reuse[j] = static_cast<int32_t>(r);
        taken[r] = true;
      }
    }
  }
}

// The peak bytes under the rules above.
void plan_peak(const Graph& graph, const std::vector<ScheduleStep>& steps, MemoryPlan& plan) {
  // Values map to buffers: a fresh output makes one, a view or a reused input shares its
  // base's, a write-back computed in place uses the graph input's (not counted). A buffer
  // is freed when the last value on it is released.
  const std::vector<Node>& nodes = graph.nodes();
  std::map<Value, int32_t> buffer_of;
  std::vector<int64_t> bytes;
  std::vector<int32_t> holders;
  int64_t live = 0;
  plan.peak_bytes = 0;
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
  for (size_t s = 0; s < steps.size(); ++s) {
    const ScheduleStep& group = steps[s];
    if (group.is_kernel()) {
      const codegen::Kernel& k = group.kernel;
      const std::vector<int32_t> ins = k.input_buffers(), outs = k.output_buffers();
      for (size_t j = 0; j < outs.size(); ++j) {
        const codegen::Buffer& out = k.buffers[static_cast<size_t>(outs[j])];
        const int32_t reuse = plan.reuse_input[s].empty() ? -1 : plan.reuse_input[s][j];
        if (plan.in_place_outputs[s][j] >= 0) continue;
        if (reuse >= 0) {
          const codegen::Buffer& in = k.buffers[static_cast<size_t>(ins[static_cast<size_t>(reuse)])];
          share({out.node, out.output_index}, {in.node, in.output_index});
        } else {
          fresh({out.node, out.output_index});
        }
      }
    } else {
      const int32_t n = group.result_node();
      const Node& node = nodes[static_cast<size_t>(n)];
      if (group.kind == ScheduleStep::view) {
        share({n, 0}, node.inputs.at(0));
      } else if (!plan.in_place_op[s] && plan.in_place_eager[s] < 0) {
        for (size_t o = 0; o < node.outputs.size(); ++o) fresh({n, static_cast<int32_t>(o)});
      }
    }
    plan.peak_bytes = std::max(plan.peak_bytes, live);
    for (Value r : plan.release_after[s]) {
      const auto it = buffer_of.find(r);
      if (it == buffer_of.end()) continue;
      if (--holders[static_cast<size_t>(it->second)] == 0) live -= bytes[static_cast<size_t>(it->second)];
      buffer_of.erase(it);
    }
  }
}

}  // namespace

MemoryPlan plan_memory(const Graph& graph, const std::vector<ScheduleStep>& steps) {
  MemoryPlan plan;
  plan_releases(graph, steps, plan);
  plan_in_place(graph, steps, plan);
  plan_reuse(graph, steps, plan);
  plan_peak(graph, steps, plan);
  return plan;
}

}  // namespace kiln::compiler
