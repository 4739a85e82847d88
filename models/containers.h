#pragma once
// Containers: Sequential (children "0", "1", ... called in order) and ModuleList (children
// held and registered, but no forward).
#include <concepts>
#include <cstdint>
#include <string>
#include <typeinfo>

#include "models/module.h"

namespace kiln::nn {

namespace detail {
[[noreturn]] void fail_module_cast(const Module& m, int64_t index, const std::type_info& wanted);
}  // namespace detail

// What Sequential and ModuleList share: children named by position.
class IndexedModules : public Module {
 public:
  // Appends `module` as child size().
  template <class T>
    requires std::derived_from<T, Module>
  void push_back(const T& module) {
    add(std::to_string(size()), module);
  }
  int64_t size() const { return static_cast<int64_t>(state().children.size()); }
  // The child at `index` (negative counts from the end), as its concrete type.
  Module& operator[](int64_t index) const;
  // The child at `index` as a T (e.g. `seq.at<nn::Linear>(0).weight()`); an error when it
  // is not one.
  template <class T>
    requires std::derived_from<T, Module>
  T& at(int64_t index) const {
    Module& m = (*this)[index];
    if (auto* t = dynamic_cast<T*>(&m)) return *t;
    detail::fail_module_cast(m, index, typeid(T));
  }
};

// Calls its children in order, each on the previous one's output. Children are stored as
// copies of their handles with their concrete types (see module.h), so each child's own
// forward runs.
class Sequential : public IndexedModules {
 public:
  Sequential() = default;
  // Sequential(nn::Linear(4, 8), nn::ReLU(), ...): the modules as children "0", "1", ...
  // (A single Sequential argument is a copy of it, not a nested child: use push_back.)
  template <class... Ms>
    requires(sizeof...(Ms) > 0 && (std::derived_from<Ms, Module> && ...))
  explicit Sequential(const Ms&... modules) {
    (push_back(modules), ...);
  }
  Tensor forward(const Tensor& x) override;
};

// Holds modules (registered, so their parameters are the owner's) for a forward the owner
// writes itself.
class ModuleList : public IndexedModules {
 public:
  ModuleList() = default;
  template <class... Ms>
    requires(sizeof...(Ms) > 0 && (std::derived_from<Ms, Module> && ...))
  explicit ModuleList(const Ms&... modules) {
    (push_back(modules), ...);
  }
};

}  // namespace kiln::nn
