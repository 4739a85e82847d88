#include "compiler/ir/graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "core/error.h"

namespace kiln::compiler {

namespace {

std::string double_text(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// Line breaks are escaped too, so that a name or string attribute cannot split a line of
// the text form.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '\n') out += "\\n";
    else if (ch == '\r') out += "\\r";
    else {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

const char* role_name(InputRole role) {
  switch (role) {
    case InputRole::data: return "input";
    case InputRole::param: return "param";
    case InputRole::state: return "state";
    case InputRole::scalar: return "scalar";
    case InputRole::random: return "random";
  }
  return "input";
}

std::optional<InputRole> role_of(std::string_view keyword) {
  for (InputRole role : {InputRole::data, InputRole::param, InputRole::state, InputRole::scalar, InputRole::random})
    if (keyword == role_name(role)) return role;
  return std::nullopt;
}

TensorType TensorType::of(const Tensor& t) {
  if (!t.defined()) return TensorType{.defined = false};
  return TensorType{.dtype = t.dtype(),
                    .shape = t.shape(),
                    .device = t.device(),
                    .layout = t.suggest_memory_format(),
                    .wrapped_number = t.is_wrapped_number()};
}

TensorType TensorType::of(const TensorMeta& m) {
  if (!m.defined) return TensorType{.defined = false};
  // Where both layouts are the same memory the type says contiguous, as eager tensors do.
  const bool channels_last = m.memory_format == MemoryFormat::channels_last && channels_last_differs(m.shape);
  return TensorType{.dtype = m.dtype,
                    .shape = m.shape,
                    .device = m.device,
                    .layout = channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous,
                    .wrapped_number = m.wrapped_number};
}

TensorMeta TensorType::meta() const {
  if (!defined) return TensorMeta{.shape = {}, .defined = false};
  return TensorMeta{shape, dtype, device, wrapped_number, true, memory_format()};
}

std::string TensorType::str() const {
  if (!defined) return "none";
  std::string s = fmt::format("{}{}", dtype, shape_str(shape));
  if (layout == MemoryFormat::channels_last) s += " nhwc";
  if (wrapped_number) s += " number";
  if (!device.is_cpu()) s += fmt::format(" {}", device);
  return s;
}

std::string attr_text(const AttrValue& value) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, double>) return double_text(x);
        else if constexpr (std::is_same_v<T, Scalar>)
          return fmt::format("${}", x.is_floating()                ? double_text(x.to_double())
                                    : x.kind() == DType::boolean ? std::string(x.to_int() ? "true" : "false")
                                                                 : fmt::format("{}", x.to_int()));
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return fmt::format("[{}]", fmt::join(x, ","));
        else if constexpr (std::is_same_v<T, DType>) return std::string(name(x));
        else if constexpr (std::is_same_v<T, Device>) return x.str();
        else return quoted(x);
      },
      value);
}

std::string attrs_text(const Attrs& attrs) {
  if (attrs.items().empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < attrs.items().size(); ++i) {
    if (i) s += ", ";
    s += attrs.items()[i].name + "=" + attr_text(attrs.items()[i].value);
  }
  return s + "}";
}

Value Graph::append(Node node) {
  const auto index = static_cast<int32_t>(nodes_.size());
  first_value_.push_back(num_values_);
  num_values_ += static_cast<int64_t>(node.outputs.size());
  nodes_.push_back(std::move(node));
  return Value{index, 0};
}

Value Graph::add_input(std::string name, TensorType type, InputRole role) {
  for (Value v : inputs_)
    KILN_CHECK(nodes_[static_cast<size_t>(v.node)].name != name, "graph: two inputs named \"{}\"", name);
  Node n{.kind = NodeKind::input, .op = "input", .outputs = {std::move(type)}, .role = role, .name = std::move(name)};
  const Value v = append(std::move(n));
  inputs_.push_back(v);
  return v;
}

Value Graph::add_constant(Scalar value, TensorType type) {
  KILN_CHECK(type.shape.empty() && type.defined, "graph: a constant must be a 0-d tensor, got {}", type.str());
  Attrs attrs{{"value", value}};
  const std::string key = "constant " + attrs_text(attrs) + " : " + type.str();
  if (auto it = interned_.find(key); it != interned_.end()) return Value{it->second, 0};
  const Value v = append(Node{.kind = NodeKind::constant, .op = "constant", .attrs = attrs, .outputs = {type}});
  interned_.emplace(key, v.node);
  return v;
}

std::vector<Value> Graph::add_op(std::string_view op, std::vector<Value> inputs, Attrs attrs, std::string source) {
  const OpDef& def = find_op(op);
  std::vector<TensorMeta> metas;
  std::string key = std::string(op) + "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value v = inputs[i];
    metas.push_back(v.defined() ? type(v).meta() : TensorMeta{.shape = {}, .defined = false});
    key += fmt::format("{}{}:{}", i ? "," : "", v.node, v.output);
  }
  key += ')';
  key += attrs_text(attrs);
  if (!def.random) {
    if (auto it = interned_.find(key); it != interned_.end()) {
      std::vector<Value> outs;
      for (size_t i = 0; i < nodes_[static_cast<size_t>(it->second)].outputs.size(); ++i)
        outs.push_back(Value{it->second, static_cast<int32_t>(i)});
      return outs;
    }
  }
  std::vector<TensorType> types;
  for (const TensorMeta& m : def.infer(metas, attrs)) types.push_back(TensorType::of(m));
  const Value first = append(Node{.kind = NodeKind::op,
                                  .op = std::string(op),
                                  .def = &def,
                                  .inputs = std::move(inputs),
                                  .attrs = std::move(attrs),
                                  .outputs = std::move(types),
                                  .source = std::move(source)});
  if (!def.random) interned_.emplace(std::move(key), first.node);
  std::vector<Value> outs;
  for (size_t i = 0; i < nodes_.back().outputs.size(); ++i) outs.push_back(Value{first.node, static_cast<int32_t>(i)});
  return outs;
}

Value Graph::add_op1(std::string_view op, std::vector<Value> inputs, Attrs attrs, std::string source) {
  std::vector<Value> outs = add_op(op, std::move(inputs), std::move(attrs), std::move(source));
  KILN_CHECK(outs.size() == 1, "graph: {} has {} outputs, add_op1 wants one", op, outs.size());
  return outs[0];
}

void Graph::add_write_back(Value input, Value value) {
  KILN_CHECK(input.defined() && node(input).kind == NodeKind::input,
             "graph: a write-back must target a graph input");
  KILN_CHECK(type(input) == type(value), "graph: write-back of {} into input \"{}\" of type {}", type(value).str(),
             node(input).name, type(input).str());
  for (auto& [target, v] : write_backs_)
    if (target == input) {
      v = value;
      return;
    }
  write_backs_.emplace_back(input, value);
}

void Graph::set_outputs(std::vector<Value> outputs) {
  for (Value v : outputs) (void)type(v);  // checks that each exists
  outputs_ = std::move(outputs);
}

const Node& Graph::node(Value v) const {
  KILN_CHECK(v.node >= 0 && static_cast<size_t>(v.node) < nodes_.size(), "graph: no node {}", v.node);
  return nodes_[static_cast<size_t>(v.node)];
}

const TensorType& Graph::type(Value v) const {
  const Node& n = node(v);
  KILN_CHECK(v.output >= 0 && static_cast<size_t>(v.output) < n.outputs.size(), "graph: node {} has no output {}",
             v.node, v.output);
  return n.outputs[static_cast<size_t>(v.output)];
}

int64_t Graph::value_number(Value v) const {
  (void)type(v);
  return first_value_[static_cast<size_t>(v.node)] + v.output;
}

uint64_t Graph::structural_hash() const {
  // FNV-1a over the printed program without its comments: the text form is canonical.
  uint64_t h = 1469598103934665603ull;
  for (char ch : print(*this, false)) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

}  // namespace kiln::compiler
