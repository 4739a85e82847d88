// The layout pass: runs a graph's convolution region channels-last (compiler/passes/passes.h).
//
// Only the convolutions are told: their activations (conv2d's input, the gradients and saved
// inputs of its backward ops) are read through a clone {channels_last=true}, and every other
// op takes the layout its shape rule gives for its new inputs (elementwise results follow a
// channels_last input, batch norm and pooling keep their input's layout, convolutions their
// activation's). So the layout spreads forward through the region by itself, and the clones
// are left only where a value enters it: the image, once (hash-consing shares the clone of a
// value read by several convolutions). Pooling gradients read no activation, so they are
// told ({channels_last=true}) to keep the region's layout. A view of a region value reads a
// contiguous copy (a view may need the strides eager code had). Outputs and write-backs are
// copied back to the layout they had (the Rewriter does this when layouts may change), so
// callers see what eager code gives them.
#include <algorithm>

#include "compiler/passes/passes.h"

namespace kiln::compiler {
namespace {

// Whether v is worth converting: a floating value not channels_last yet whose
// channels_last layout differs from the contiguous one.
bool convertible(const Rewriter& rw, Value v) {
  if (!v.defined()) return false;
  const TensorType& t = rw.type(v);
  return t.layout == MemoryFormat::contiguous && channels_last_differs(t.shape) && is_floating(t.dtype);
}

// The inputs of each convolution op that it reads as activations (N, C, H, W).
std::vector<size_t> activation_inputs(const std::string& op) {
  if (op == "conv2d" || op == "conv2d_backward_input") return {0};
  if (op == "conv2d_backward_weight") return {0, 1};
  return {};
}

std::vector<Rule> make_layout_rules() {
  std::vector<Rule> rules;
  rules.push_back({"nhwc_convolution", {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"},
                   [](Rewriter& rw, const Candidate& c) -> Replacement {
                     if (c.attrs.has("groups") && c.attrs.i("groups") != 1) return std::nullopt;
                     Values inputs = c.inputs;
                     bool changed = false;
                     for (size_t i : activation_inputs(c.op())) {
                       if (!convertible(rw, inputs[i])) continue;
                       inputs[i] = rw.add_op1("clone", {inputs[i]}, {{"channels_last", true}}, "layout");
                       changed = true;
                     }
                     if (!changed) return std::nullopt;
                     return rw.add_op(c.op(), std::move(inputs), c.attrs, c.source);
                   }});
  rules.push_back({"nhwc_pool_backward", {"max_pool2d_backward", "avg_pool2d_backward", "adaptive_avg_pool2d_backward"},
                   [](Rewriter& rw, const Candidate& c) -> Replacement {
                     if (c.attrs.has("channels_last") && c.attrs.b("channels_last")) return std::nullopt;
                     if (!channels_last_differs(c.outputs.at(0).shape)) return std::nullopt;
                     Attrs attrs = c.attrs;
                     attrs.set("channels_last", true);
                     return rw.add_op(c.op(), c.inputs, std::move(attrs), c.source);
                   }});
  // A view is index arithmetic on its input's strides, and some (view, flatten) need the
  // contiguous ones: a view of a region value reads a contiguous copy, where eager code's
  // NCHW value was (SmallCNN's flatten before its classifier).
  rules.push_back({"contiguous_before_view", {}, [](Rewriter& rw, const Candidate& c) -> Replacement {
                     if (c.def.kind != OpKind::view || c.inputs.empty() || !c.inputs[0].defined() ||
                         rw.type(c.inputs[0]).layout != MemoryFormat::channels_last)
                       return std::nullopt;
                     Values inputs = c.inputs;
                     inputs[0] = rw.add_op1("clone", {inputs[0]}, {}, "layout");
                     return rw.add_op(c.op(), std::move(inputs), c.attrs, c.source);
                   }});
  return rules;
}

// Whether the graph has a convolution (automatic and channels_last convert it on every
// device, compiler/passes/passes.h).
bool has_convolution(const Graph& graph) {
  return std::any_of(graph.nodes().begin(), graph.nodes().end(),
                     [&](const Node& n) { return n.kind == NodeKind::op && n.op == "conv2d"; });
}

}  // namespace

const std::vector<Rule>& layout_rules() {
  static const std::vector<Rule> rules = make_layout_rules();
  return rules;
}

const char* layout_policy_name(LayoutPolicy policy) {
  switch (policy) {
    case LayoutPolicy::automatic: return "auto";
    case LayoutPolicy::keep: return "keep";
    case LayoutPolicy::channels_last: return "channels_last";
  }
  return "?";
}

Graph choose_layout(const Graph& graph, LayoutPolicy policy, RewriteLog* log) {
  if (policy == LayoutPolicy::keep || !has_convolution(graph)) return graph;
  Rewriter rw(graph, layout_rules(), log);
  rw.allow_layout_changes();
  return rw.run();
}

Graph channels_last(const Graph& graph, RewriteLog* log) {
  return choose_layout(graph, LayoutPolicy::channels_last, log);
}

}  // namespace kiln::compiler
