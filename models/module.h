#pragma once
// nn::Module: the base of every layer and model, with PyTorch's semantics.
//
// A module is a handle, like Tensor: it holds a shared_ptr to its state (parameters,
// buffers, children, training flag), so copying a module shares all of it. That is what
// lets a model be a plain class whose members are registered in one line:
//
//   struct Block : nn::Module {
//     nn::Conv2d conv = add("conv", nn::Conv2d(64, 64, 3, {.padding = 1, .bias = false}));
//     nn::BatchNorm2d bn = add("bn", nn::BatchNorm2d(64));
//     Tensor forward(const Tensor& x) override { return relu(bn(conv(x)) + x); }
//   };
//
// `add` registers the child and returns a copy of the handle, so the member and the
// registered child are the same module. Copying a Block copies its base handle and its
// member handles: the copy shares everything with the original.
//
// Dispatch on the concrete type (Sequential calling each child's forward, printing each
// child's type name and extra_repr) works because the parent keeps, for each child, a
// heap copy of the child's handle made with the child's static type at `add` time
// (std::make_shared<T>(child)). Virtual calls through that copy reach T's overrides. The
// parent's state owns copies of its children's handles, never of its own, so there are no
// ownership cycles. children(), modules() and friends therefore give pointers to those
// copies (and `this` for the module itself): valid while the module they came from lives.
//
// Parameters and buffers are Tensors. Converting a module (to(dtype), to(device)) replaces
// the data of each tensor's TensorImpl in place, so every handle to a parameter (a member
// `Tensor w = add_parameter(...)`, an optimizer's list, conv.weight()) sees the new data.
#include <concepts>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "models/module_adapters.h"

namespace kiln::nn {

class Module;

namespace detail {
// What a module handle points at; shared by every copy of the handle.
struct ModuleState {
  std::vector<std::pair<std::string, Tensor>> parameters;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<std::string> non_persistent_buffers;  // left out of state_dict
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children;
  bool training = true;
};
// The unqualified, demangled name of a type ("kiln::nn::Linear" -> "Linear").
std::string type_name_of(const std::type_info& type);
}  // namespace detail

class Module {
 public:
  // A new module with no parameters, buffers or children, in training mode.
  Module();
  Module(const Module&) = default;
  Module& operator=(const Module&) = default;
  // No move operations on purpose: moving falls back to copying the handle, so a
  // moved-from module is still a valid handle to the same state.
  virtual ~Module() = default;

  // ---- registration ----

  // Registers `child` under `name` and returns the same module (a copy of the handle), to
  // initialize the member that holds it.
  template <class T>
    requires std::derived_from<T, Module>
  T add(const std::string& name, const T& child) {
    register_child(name, std::make_shared<T>(child));
    return child;
  }
  // Registers `tensor` as a parameter (a leaf that requires grad) and returns it. A
  // non-leaf is detached first; an undefined tensor is not registered (like bias=None)
  // and comes back undefined.
  Tensor add_parameter(const std::string& name, const Tensor& tensor);
  // Registers `tensor` as a buffer (state that is not trained, e.g. running_mean) and
  // returns it; a non-persistent buffer is left out of state_dict.
  Tensor add_buffer(const std::string& name, const Tensor& tensor, bool persistent = true);

  // The direct parameter, buffer or child `name`; an undefined tensor (or null) when absent.
  Tensor parameter(const std::string& name) const;
  Tensor buffer(const std::string& name) const;
  Module* child(const std::string& name) const;

  // ---- forward ----

  // The layer's computation; layers override it. User modules may instead define a
  // forward with other arguments (then this one, and operator(), fail when called).
  virtual Tensor forward(const Tensor& input);
  // Calls forward.
  Tensor operator()(const Tensor& input) { return forward(input); }

  // ---- traversal ----

  // Parameters of this module and (recurse) its descendants, each once, in registration
  // order; names are dotted paths ("layer1.0.conv1.weight").
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  // Direct children.
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  // This module first, then every descendant once, depth first; the root's name is "".
  std::vector<Module*> modules();
  std::vector<std::pair<std::string, Module*>> named_modules();

  // ---- state ----

  // Sets training mode on this module and every descendant; returns *this.
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return state_->training; }

  // Converts floating parameters and buffers (with their gradients) to `dtype`, in place.
  Module& to(DType dtype);
  // Moves every parameter and buffer (with gradients) to `device`, in place.
  Module& to(Device device);
  // Lays out every 4-d parameter and buffer (and gradient) in `format`, in place, as
  // PyTorch's module.to(memory_format=...): channels_last convolution weights are what
  // cuDNN's NHWC convolutions read without a transpose. Other tensors are left as they are.
  Module& to(MemoryFormat format);

  // Clears gradients: undefined (set_to_none) or zero-filled.
  void zero_grad(bool set_to_none = true);
  // Calls fn on every descendant and then on this module (children first, as PyTorch).
  Module& apply(const std::function<void(Module&)>& fn);

  // Parameters and persistent buffers by dotted name, detached (they share storage).
  std::map<std::string, Tensor> state_dict() const;
  // Copies `state` into the existing parameters and buffers (converting dtypes). With
  // strict, missing or unexpected keys are an error; a shape mismatch always is. Errors
  // list every offending key.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // ---- printing ----

  // The class name ("Linear"), read from the dynamic type.
  virtual std::string type_name() const;
  // The layer's settings shown between the parentheses when printed.
  virtual std::string extra_repr() const { return ""; }
  // PyTorch's tree: "Sequential(\n  (0): Linear(in_features=4, ...)\n  (1): ReLU()\n)".
  std::string str() const;

  // Whether two handles share one state.
  bool same(const Module& other) const { return state_ == other.state_; }

 protected:
  detail::ModuleState& state() const { return *state_; }
  // Registers a heap copy of a child handle (see `add`).
  void register_child(const std::string& name, std::shared_ptr<Module> child);

 private:
  void check_new_name(const std::string& name, const char* what) const;
  // Calls fn(name, module) for this module (name = prefix) and its descendants.
  void visit(const std::string& prefix, bool dedup,
             const std::function<void(const std::string&, Module&)>& fn) const;
  enum class TensorKind { parameter, buffer, persistent_buffer };
  // Calls fn(dotted name, tensor) for the tensors of one kind here and (recurse) below.
  void visit_tensors(TensorKind kind, bool recurse, bool dedup,
                     const std::function<void(const std::string&, const Tensor&)>& fn) const;
  // Replaces the data of every parameter and buffer (and gradient) by convert(t).
  void convert_tensors(const std::function<Tensor(const Tensor&)>& convert);

  std::shared_ptr<detail::ModuleState> state_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace kiln::nn
