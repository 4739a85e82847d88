// Building the backward graph: the recorder that turns each op on grad-requiring inputs
// into a node, the nodes themselves, and Tensor's autograd methods.
#include <algorithm>
#include <atomic>
#include <mutex>

#include "autograd/formula.h"
#include "autograd/meta.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/reduce.h"

namespace kiln {

int next_hook_handle() {
  static std::atomic<int> next{1};
  return next++;
}

AutogradMeta& autograd_meta(const Tensor& t) {
  TensorImpl* impl = t.impl();
  KILN_CHECK(impl, "autograd: the tensor is undefined");
  if (!impl->autograd) impl->autograd = std::make_shared<AutogradMeta>();
  return *impl->autograd;
}

// ---- saved tensors ----

namespace {

// A tensor saved for backward: the data without its graph (an output saved with its
// grad_fn would keep its own node alive), and the version it had, so that a later
// in-place change is caught instead of giving a wrong gradient.
struct SavedTensor {
  Tensor data;
  uint64_t version = 0;
  bool saved = false;  // stays true after release(), so a later read says "freed"

  // Outputs are saved without their graph (an output's grad_fn is the node saving it:
  // a cycle); inputs keep theirs, so that a create_graph backward stays connected.
  static SavedTensor of(const Tensor& t, bool is_output) {
    if (!t.defined()) return {};
    return {is_output ? t.detach() : t, t.storage()->version.load(), true};
  }
  const Tensor& unpack(const OpDef& op, size_t index, const char* what) const {
    KILN_CHECK(data.defined(),
               "{}: backward needs {} {}, which was freed (call backward with retain_graph=true "
               "to backward through the graph a second time)",
               op.name, what, index);
    KILN_CHECK(data.storage()->version.load() == version,
               "{}: {} {} ({}) needed for the gradient was modified by an in-place operation "
               "(version {} now, {} when saved)",
               op.name, what, index, data.meta_str(), data.storage()->version.load(), version);
    return data;
  }
};

// The node of one recorded op.
class OpNode final : public Node {
 public:
  OpNode(const OpCall& call, std::vector<Edge> edges) : op_(call.op), attrs_(call.attrs) {
    next_edges_ = std::move(edges);
    num_outputs_ = static_cast<uint32_t>(call.outputs.size());
    const BackwardFormula* f = op_.backward;
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor& t = call.inputs[i];
      input_metas_.push_back(TensorMeta::of(t));
      const bool before = i < call.inputs_before.size() && call.inputs_before[i].defined();
      const Tensor& value = before ? call.inputs_before[i] : t;
      const bool save = f && f->saves_inputs &&
                        std::find(f->unsaved_inputs.begin(), f->unsaved_inputs.end(),
                                  static_cast<int>(i)) == f->unsaved_inputs.end();
      inputs_.push_back(save ? SavedTensor::of(value, false) : SavedTensor{});
    }
    for (const Tensor& t : call.outputs)
      outputs_.push_back(f && f->saves_outputs ? SavedTensor::of(t, true) : SavedTensor{});
  }

  std::vector<Tensor> apply(std::vector<Tensor> grads) override {
    KILN_CHECK(op_.backward, "{}: backward is not implemented for this op", op_.name);
    std::vector<Tensor> inputs, outputs;
    for (size_t i = 0; i < inputs_.size(); ++i)
      inputs.push_back(inputs_[i].saved ? inputs_[i].unpack(op_, i, "input") : Tensor());
    for (size_t i = 0; i < outputs_.size(); ++i) {
      if (!outputs_[i].saved) {
        outputs.emplace_back();
        continue;
      }
      Tensor out = outputs_[i].unpack(op_, i, "output");
      if (GradMode::is_enabled() && is_floating(out.dtype())) {
        // A create_graph backward: reattach the output to this node (saved without it to
        // avoid a cycle), so that formulas reading it stay differentiable.
        out = out.detach();
        AutogradMeta& meta = autograd_meta(out);
        meta.grad_fn = shared_from_this();
        meta.output_nr = static_cast<uint32_t>(i);
        out.impl()->requires_grad = true;
      }
      outputs.push_back(out);
    }
    std::unique_ptr<bool[]> needs(new bool[next_edges_.size()]);
    for (size_t i = 0; i < next_edges_.size(); ++i) needs[i] = next_edges_[i].node != nullptr;
    BackwardContext ctx{op_,     attrs_,       inputs, outputs, input_metas_,
                        grads,   std::span<const bool>(needs.get(), next_edges_.size())};
    std::vector<Tensor> result = op_.backward->fn(ctx);
    KILN_CHECK(result.size() == next_edges_.size(),
               "{}: the backward formula returned {} gradients for {} inputs", op_.name,
               result.size(), next_edges_.size());
    return result;
  }

  std::string name() const override { return op_.name + "_backward"; }
  void release() override {
    for (SavedTensor& s : inputs_) s.data = Tensor();
    for (SavedTensor& s : outputs_) s.data = Tensor();
  }

 private:
  const OpDef& op_;
  Attrs attrs_;
  std::vector<TensorMeta> input_metas_;
  std::vector<SavedTensor> inputs_, outputs_;
};

// A leaf's sink: adds the incoming gradient into the leaf's .grad.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf) : leaf_(leaf.impl_ptr()) { num_outputs_ = 1; }

  std::vector<Tensor> apply(std::vector<Tensor> grads) override {
    std::lock_guard lock(mutex_);  // two threads' backward passes may share a leaf
    std::shared_ptr<TensorImpl> impl = leaf_.lock();
    if (!impl || !grads[0].defined()) return {};
    Tensor leaf(impl);
    AutogradMeta& meta = autograd_meta(leaf);
    Tensor g = std::move(grads[0]);
    grads.clear();
    // Copies: a hook may remove itself (or others) while it runs.
    const auto leaf_hooks = meta.leaf_hooks;
    for (const auto& [handle, hook] : leaf_hooks) {
      Tensor replaced = hook(g);
      if (replaced.defined()) g = replaced;
    }
    if (g.shape() != leaf.shape()) g = sum_to(g, leaf.shape());
    if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
    if (!meta.grad.defined()) {
      // Own the memory: the same gradient tensor may flow to several leaves (a + b), or be
      // a view of something else (an expand).
      meta.grad = GradMode::is_enabled() ? g.clone() : own_gradient(std::move(g), leaf);
    } else if (GradMode::is_enabled()) {
      meta.grad = meta.grad + g;  // create_graph: keep the sum differentiable
    } else {
      meta.grad.add_(g);
    }
    const auto post_hooks = meta.post_accumulate_hooks;
    for (const auto& [handle, hook] : post_hooks) hook(leaf);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
  std::mutex mutex_;
};

void record(const OpCall& call) {
  bool differentiable_output = false;
  for (const Tensor& t : call.outputs) differentiable_output |= is_floating(t.dtype());
  if (!differentiable_output) return;
  std::vector<Edge> edges;
  edges.reserve(call.inputs.size());
  for (const Tensor& t : call.inputs)
    edges.push_back(t.defined() && t.requires_grad() ? gradient_edge(t) : Edge{});
  auto node = std::make_shared<OpNode>(call, std::move(edges));
  for (size_t k = 0; k < call.outputs.size(); ++k) {
    const Tensor& out = call.outputs[k];
    if (!is_floating(out.dtype())) continue;
    AutogradMeta& meta = autograd_meta(out);
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(k);
    out.impl()->requires_grad = true;
  }
}

struct RecorderInstaller {
  RecorderInstaller() { set_autograd_recorder(record); }
} installer;

}  // namespace

Edge gradient_edge(const Tensor& t) {
  AutogradMeta& meta = autograd_meta(t);
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  if (!meta.accumulator) meta.accumulator = std::make_shared<AccumulateGrad>(t);
  return {meta.accumulator, 0};
}

// ---- BackwardContext ----

const Tensor& BackwardContext::input(size_t i) const {
  KILN_CHECK(i < inputs.size() && inputs[i].defined(),
             "{}: the backward formula reads input {}, which the op did not save", op.name, i);
  return inputs[i];
}
const Tensor& BackwardContext::output(size_t i) const {
  KILN_CHECK(i < outputs.size() && outputs[i].defined(),
             "{}: the backward formula reads output {}, which the op did not save", op.name, i);
  return outputs[i];
}

void register_backward(std::string_view op, BackwardFormula formula) {
  // Formulas live for the whole program, like the ops they belong to.
  set_backward(op, new BackwardFormula(formula), formula.saves_inputs);
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  KILN_CHECK(lead >= 0, "sum_to: gradient {} has fewer dims than the shape {}", grad.meta_str(),
             shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  Tensor g = dims.empty() ? grad : sum(grad, dims, true);
  return g.reshape(shape);
}

// ---- Tensor's autograd methods ----

Tensor& Tensor::requires_grad_(bool on) {
  KILN_CHECK(is_leaf(),
             "requires_grad_: only leaf tensors can change requires_grad ({} was made by {}); "
             "use detach() for a leaf",
             meta_str(), grad_fn()->name());
  KILN_CHECK(!on || is_floating(dtype()),
             "requires_grad_: only floating tensors can require gradients, got {}", meta_str());
  impl()->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const TensorImpl& t = get();
  return !t.autograd || !t.autograd->grad_fn;
}

Tensor Tensor::grad() const {
  const TensorImpl& t = get();
  return t.autograd ? t.autograd->grad : Tensor();
}

namespace {
thread_local SetGradHook t_set_grad_hook;
}  // namespace

SetGradHookGuard::SetGradHookGuard(SetGradHook hook) : ScopedHook(t_set_grad_hook, std::move(hook)) {}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined())
    KILN_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
               "set_grad: gradient {} does not match the tensor {}", grad.meta_str(), meta_str());
  if (t_set_grad_hook) t_set_grad_hook(*this);
  autograd_meta(*this).grad = grad;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const TensorImpl& t = get();
  return t.autograd ? t.autograd->grad_fn : nullptr;
}

Tensor Tensor::detach() const {
  const TensorImpl& t = get();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage;
  impl->shape = t.shape;
  impl->strides = t.strides;
  impl->offset = t.offset;
  impl->dtype = t.dtype;
  impl->device = t.device;
  impl->wrapped_number = t.wrapped_number;
  return Tensor(std::move(impl));
}

void Tensor::retain_grad() const {
  KILN_CHECK(requires_grad(), "retain_grad: {} does not require grad", meta_str());
  if (is_leaf()) return;
  AutogradMeta& meta = autograd_meta(*this);
  if (meta.retains_grad) return;
  meta.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  meta.grad_fn->output_hooks()[meta.output_nr][next_hook_handle()] = [weak](const Tensor& g) {
    if (auto impl = weak.lock()) {
      Tensor self(impl);
      AutogradMeta& m = autograd_meta(self);
      m.grad = m.grad.defined() ? m.grad + g : g.detach().clone();
    }
    return Tensor();
  };
}

int Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  KILN_CHECK(requires_grad(), "register_hook: {} does not require grad", meta_str());
  const int handle = next_hook_handle();
  AutogradMeta& meta = autograd_meta(*this);
  if (meta.grad_fn) meta.grad_fn->output_hooks()[meta.output_nr][handle] = std::move(hook);
  else meta.leaf_hooks[handle] = std::move(hook);
  return handle;
}

void Tensor::remove_hook(int handle) const {
  AutogradMeta& meta = autograd_meta(*this);
  meta.leaf_hooks.erase(handle);
  meta.post_accumulate_hooks.erase(handle);
  if (meta.grad_fn)
    for (auto& [k, hooks] : meta.grad_fn->output_hooks()) hooks.erase(handle);
}

int Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  KILN_CHECK(is_leaf() && requires_grad(),
             "register_post_accumulate_grad_hook: {} is not a leaf that requires grad",
             meta_str());
  const int handle = next_hook_handle();
  autograd_meta(*this).post_accumulate_hooks[handle] = std::move(hook);
  return handle;
}

Tensor own_gradient(Tensor g, const Tensor& leaf) {
  // g's memory is kept when nothing else can reach it: no other handle, no saved tensor, no
  // other view (its base, if g is a view, is held by g alone), g covers all of it, and it is
  // laid out as the leaf is. A Linear weight's gradient (16 MiB for a 4096x1024 layer) is
  // such a tensor; copying it every step cost more than the layer's pointwise work.
  const TensorImpl& impl = *g.impl();
  auto unshared = [&] {
    if (g.impl_ptr().use_count() != 1 || impl.autograd || impl.wrapped_number) return false;
    long holders = 1;
    if (impl.view_base) {
      if (impl.view_base.use_count() != 1 || impl.view_base->storage != impl.storage) return false;
      ++holders;
    }
    const Storage& storage = impl.storage;
    return storage && storage.use_count() == holders && storage->deleter && impl.offset == 0 &&
           storage->nbytes == static_cast<size_t>(g.numel()) * itemsize(g.dtype()) &&
           g.is_contiguous(leaf.suggest_memory_format());
  };
  if (!unshared()) return g.detach().clone();
  auto own = std::make_shared<TensorImpl>();
  own->storage = impl.storage;
  own->shape = impl.shape;
  own->strides = impl.strides;
  own->dtype = impl.dtype;
  own->device = impl.device;
  return Tensor(std::move(own));
}

}  // namespace kiln
