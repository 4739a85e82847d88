// The backward pass: walk the graph from the root, count how many gradients each node
// waits for, and run nodes as their inputs complete (Kahn's algorithm), summing the
// gradients that meet at a node.
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autograd/formula.h"
#include "autograd/meta.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"

namespace kiln {
namespace {

// Adds `g` into slot, which may be empty.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  slot = slot.defined() ? slot + g : g;
}

void run_backward(const Edge& root, const Tensor& root_grad, bool retain_graph) {
  // Dependencies: how many edges point at each node from nodes that will run.
  std::unordered_map<Node*, int> waiting;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::vector<Node*> stack{root.node.get()};
  owners[root.node.get()] = root.node;
  std::unordered_set<Node*> seen{root.node.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.node) continue;
      ++waiting[e.node.get()];
      if (seen.insert(e.node.get()).second) {
        owners[e.node.get()] = e.node;
        stack.push_back(e.node.get());
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  buffers[root.node.get()].resize(root.node->num_outputs());
  buffers[root.node.get()][root.input_nr] = root_grad;
  std::vector<Node*> ready{root.node.get()};
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->num_outputs());
    const auto output_hooks = n->output_hooks();  // a copy: hooks may remove themselves
    for (const auto& [k, hooks] : output_hooks) {
      if (k >= grads.size() || !grads[k].defined()) continue;
      for (const auto& [handle, hook] : hooks) {
        Tensor replaced = hook(grads[k]);
        if (replaced.defined()) grads[k] = replaced;
      }
    }
    bool any = false;
    for (const Tensor& g : grads) any |= g.defined();
    std::vector<Tensor> input_grads;
    if (any) input_grads = n->apply(std::move(grads));
    const auto& edges = n->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.node) continue;
      std::vector<Tensor>& buf = buffers[e.node.get()];
      if (buf.empty()) buf.resize(e.node->num_outputs());
      if (i < input_grads.size()) accumulate(buf[e.input_nr], input_grads[i]);
      if (--waiting[e.node.get()] == 0) ready.push_back(e.node.get());
    }
    if (!retain_graph) n->release();
  }
}

}  // namespace

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  KILN_CHECK(requires_grad(),
             "backward: {} does not require grad and has no grad_fn (did an input call "
             "requires_grad_()? was it computed under NoGradGuard?)",
             meta_str());
  Tensor g = gradient;
  if (!g.defined()) {
    KILN_CHECK(numel() == 1,
               "backward: a gradient can be implied only for a one-element output, got {}; pass "
               "the gradient",
               meta_str());
    g = ones_like(*this);
  }
  KILN_CHECK(g.shape() == shape() && g.device() == device(),
             "backward: gradient {} does not match the output {}", g.meta_str(), meta_str());
  if (g.dtype() != dtype()) g = g.to(dtype());
  if (!create_graph) g = g.detach();
  // Formulas run with grad mode on only when the caller wants a graph of the backward.
  if (create_graph) {
    EnableGradGuard guard;
    run_backward(gradient_edge(*this), g, retain_graph || create_graph);
  } else {
    NoGradGuard guard;
    run_backward(gradient_edge(*this), g, retain_graph);
  }
}

}  // namespace kiln
