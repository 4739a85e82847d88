// nn::Module: registration, traversal, conversion, state dicts and printing.
#include "models/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <typeinfo>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/factory.h"

namespace kiln::nn {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// "kiln::nn::Linear" -> "Linear"; template arguments are kept as they are.
std::string unqualified(const std::string& name) {
  const size_t template_start = std::min(name.find('<'), name.size());
  const size_t colons = name.rfind("::", template_start);
  return colons == std::string::npos ? name : name.substr(colons + 2);
}

// PyTorch's _addindent: indents every line but the first.
std::string indent_tail(const std::string& s, int spaces) {
  std::string out;
  const std::string pad(static_cast<size_t>(spaces), ' ');
  for (char c : s) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  if (s.empty()) return lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "\"" : ", \"") + k + "\"";
  return out;
}

}  // namespace

Module::Module() : state_(std::make_shared<detail::ModuleState>()) {}

// ---- registration ----

void Module::check_new_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "{}: name '{}' in {} must be non-empty and contain no '.'", what, name, type_name());
  const auto has = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& kv) { return kv.first == name; });
  };
  KILN_CHECK(!has(state_->parameters) && !has(state_->buffers) && !has(state_->children),
             "{}: '{}' is already registered in {}", what, name, type_name());
}

void Module::register_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name, "add");
  KILN_CHECK(child && child->state_ != state_, "add: {} cannot be its own child '{}'",
             type_name(), name);
  // A cycle would make every traversal recurse forever (and leak both modules).
  bool cycle = false;
  child->visit("", true, [&](const std::string&, Module& m) { cycle |= m.state_ == state_; });
  KILN_CHECK(!cycle, "add: {} '{}' already contains {}: a module cannot contain itself",
             child->type_name(), name, type_name());
  state_->children.emplace_back(name, std::move(child));
}

Tensor Module::add_parameter(const std::string& name, const Tensor& tensor) {
  check_new_name(name, "add_parameter");
  if (!tensor.defined()) return {};
  KILN_CHECK(is_floating(tensor.dtype()),
             "add_parameter: parameter '{}' of {} must be floating, got {}", name, type_name(),
             tensor.meta_str());
  Tensor param = tensor.is_leaf() ? tensor : tensor.detach();
  param.requires_grad_(true);
  state_->parameters.emplace_back(name, param);
  return param;
}

Tensor Module::add_buffer(const std::string& name, const Tensor& tensor, bool persistent) {
  check_new_name(name, "add_buffer");
  KILN_CHECK(tensor.defined(), "add_buffer: buffer '{}' of {} is undefined", name, type_name());
  state_->buffers.emplace_back(name, tensor);
  if (!persistent) state_->non_persistent_buffers.push_back(name);
  return tensor;
}

Tensor Module::parameter(const std::string& name) const {
  for (const auto& [n, t] : state_->parameters)
    if (n == name) return t;
  return {};
}

Tensor Module::buffer(const std::string& name) const {
  for (const auto& [n, t] : state_->buffers)
    if (n == name) return t;
  return {};
}

Module* Module::child(const std::string& name) const {
  for (const auto& [n, m] : state_->children)
    if (n == name) return m.get();
  return nullptr;
}

Tensor Module::forward(const Tensor& input) {
  fail("{}: forward(const Tensor&) is not implemented (input {}); a module whose forward takes "
       "other arguments is called through that forward",
       type_name(), input.defined() ? input.meta_str() : std::string("undefined"));
}

// ---- traversal ----

void Module::visit(const std::string& prefix, bool dedup,
                   const std::function<void(const std::string&, Module&)>& fn) const {
  std::set<const detail::ModuleState*> seen;
  std::function<void(const std::string&, Module&)> walk = [&](const std::string& name,
                                                              Module& m) {
    if (dedup && !seen.insert(m.state_.get()).second) return;
    fn(name, m);
    for (auto& [child_name, child] : m.state_->children) walk(join_name(name, child_name), *child);
  };
  walk(prefix, const_cast<Module&>(*this));
}

void Module::visit_tensors(TensorKind kind, bool recurse, bool dedup,
                           const std::function<void(const std::string&, const Tensor&)>& fn) const {
  std::set<const TensorImpl*> seen;
  const auto visit_one = [&](const std::string& prefix, Module& m) {
    const detail::ModuleState& s = *m.state_;
    const auto& list = kind == TensorKind::parameter ? s.parameters : s.buffers;
    for (const auto& [name, t] : list) {
      if (kind == TensorKind::persistent_buffer &&
          std::count(s.non_persistent_buffers.begin(), s.non_persistent_buffers.end(), name))
        continue;
      if (dedup && !seen.insert(t.impl()).second) continue;
      fn(join_name(prefix, name), t);
    }
  };
  if (recurse) {
    visit("", dedup, visit_one);
  } else {
    visit_one("", const_cast<Module&>(*this));
  }
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  visit_tensors(TensorKind::parameter, recurse, true,
                [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit_tensors(TensorKind::parameter, recurse, true,
                [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  visit_tensors(TensorKind::buffer, recurse, true,
                [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit_tensors(TensorKind::buffer, recurse, true,
                [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const auto& [name, m] : state_->children) out.push_back(m.get());
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const auto& [name, m] : state_->children) out.emplace_back(name, m.get());
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  visit("", true, [&](const std::string&, Module& m) { out.push_back(&m); });
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  visit("", true, [&](const std::string& n, Module& m) { out.emplace_back(n, &m); });
  return out;
}

// ---- state ----

Module& Module::train(bool on) {
  visit("", true, [&](const std::string&, Module& m) { m.state_->training = on; });
  return *this;
}

void Module::convert_tensors(const std::function<Tensor(const Tensor&)>& convert) {
  NoGradGuard no_grad;
  const auto convert_in_place = [&](const std::string&, const Tensor& t) {
    Tensor converted = convert(t);
    if (converted.same(t)) return;
    const Tensor grad = t.grad();
    // Swap the data under the same TensorImpl: every handle to `t` sees the new data, and
    // autograd's per-tensor state (requires_grad, hooks, the accumulator) stays attached.
    TensorImpl& impl = *t.impl();
    const TensorImpl& src = *converted.impl();
    impl.storage = src.storage;
    impl.shape = src.shape;
    impl.strides = src.strides;
    impl.offset = src.offset;
    impl.dtype = src.dtype;
    impl.device = src.device;
    if (grad.defined()) t.set_grad(convert(grad));
  };
  visit_tensors(TensorKind::parameter, true, true, convert_in_place);
  visit_tensors(TensorKind::buffer, true, true, convert_in_place);
}

Module& Module::to(DType dtype) {
  convert_tensors([&](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; });
  return *this;
}

Module& Module::to(Device device) {
  convert_tensors([&](const Tensor& t) { return t.to(device); });
  return *this;
}

Module& Module::to(MemoryFormat format) {
  convert_tensors([&](const Tensor& t) { return t.dim() == 4 ? t.contiguous(format) : t; });
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      p.set_grad({});
    } else if (grad.requires_grad()) {
      p.set_grad(zeros_like(grad));  // a gradient made with create_graph: cut it from its graph
    } else {
      grad.zero_();
    }
  }
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  // Children first, as in PyTorch; a module shared by two parents is visited once.
  std::set<const detail::ModuleState*> seen;
  std::function<void(Module&)> walk = [&](Module& m) {
    if (!seen.insert(m.state_.get()).second) return;
    for (auto& [name, child] : m.state_->children) walk(*child);
    fn(m);
  };
  walk(*this);
  return *this;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  const auto add = [&](const std::string& n, const Tensor& t) { out.emplace(n, t.detach()); };
  visit_tensors(TensorKind::parameter, true, false, add);
  visit_tensors(TensorKind::persistent_buffer, true, false, add);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::map<std::string, Tensor> own;
  const auto add = [&](const std::string& n, const Tensor& t) { own.emplace(n, t); };
  visit_tensors(TensorKind::parameter, true, false, add);
  visit_tensors(TensorKind::persistent_buffer, true, false, add);

  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : own) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (!it->second.defined() || it->second.shape() != t.shape()) {
      mismatched.push_back(fmt::format(
          "size mismatch for {}: the checkpoint has shape {}, the model {}", name,
          it->second.defined() ? shape_str(it->second.shape()) : std::string("undefined"),
          shape_str(t.shape())));
    }
  }
  for (const auto& [name, t] : state)
    if (!own.count(name)) unexpected.push_back(name);

  std::string errors;
  if (strict && !missing.empty()) errors += "\n\tmissing keys: " + quoted_list(missing);
  if (strict && !unexpected.empty()) errors += "\n\tunexpected keys: " + quoted_list(unexpected);
  for (const std::string& m : mismatched) errors += "\n\t" + m;
  KILN_CHECK(errors.empty(), "load_state_dict: error(s) in loading the state dict of {}:{}",
             type_name(), errors);

  NoGradGuard no_grad;
  for (auto& [name, t] : own) {
    auto it = state.find(name);
    if (it != state.end()) t.copy_(it->second);
  }
}

// ---- printing ----

std::string Module::type_name() const { return detail::type_name_of(typeid(*this)); }

std::string detail::type_name_of(const std::type_info& type) {
  const char* mangled = type.name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return unqualified(status == 0 && demangled ? demangled.get() : mangled);
}

std::string Module::str() const {
  std::vector<std::string> lines = split_lines(extra_repr());
  const size_t extra_lines = lines.size();
  for (const auto& [name, child] : state_->children)
    lines.push_back("(" + name + "): " + indent_tail(child->str(), 2));
  std::string out = type_name() + "(";
  if (extra_lines == 1 && state_->children.empty()) {
    out += lines[0];
  } else if (!lines.empty()) {
    out += "\n  ";
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n  " : "") + lines[i];
    out += "\n";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace kiln::nn
