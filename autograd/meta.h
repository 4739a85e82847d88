#pragma once
// What autograd keeps per tensor: its gradient, the node that made it, and hooks.
#include <functional>
#include <map>
#include <memory>

#include "autograd/node.h"
#include "core/scoped_hook.h"

namespace kiln {

struct AutogradMeta {
  Tensor grad;
  std::shared_ptr<Node> grad_fn;      // null for leaves
  uint32_t output_nr = 0;             // which output of grad_fn this tensor is
  std::shared_ptr<Node> accumulator;  // a leaf's AccumulateGrad node, made on first use
  bool retains_grad = false;
  std::map<int, std::function<Tensor(const Tensor&)>> leaf_hooks;
  std::map<int, std::function<void(const Tensor&)>> post_accumulate_hooks;
};

// The tensor's meta, made on first use.
AutogradMeta& autograd_meta(const Tensor& t);
// The edge a gradient for `t` travels along: its grad_fn's output, or its accumulator.
Edge gradient_edge(const Tensor& t);
// What becomes a leaf's new .grad from the gradient g (pass the only handle to it, moved):
// g's own memory when nothing else can reach it and it is laid out as the leaf is (as
// PyTorch's AccumulateGrad steals a gradient), else a copy. Never differentiable.
Tensor own_gradient(Tensor g, const Tensor& leaf);

// Told before Tensor::set_grad replaces a tensor's .grad (one per thread; install with
// SetGradHookGuard, guards nest): the tracer learns what a leaf's .grad was when the
// traced function started, even when the function cleared it (zero_grad) before using
// the leaf.
using SetGradHook = std::function<void(const Tensor& tensor)>;
class SetGradHookGuard : ScopedHook<SetGradHook> {
 public:
  explicit SetGradHookGuard(SetGradHook hook);
};
// A handle number, unique in the process.
int next_hook_handle();

}  // namespace kiln
