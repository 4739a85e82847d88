#include "compiler/run_graph.h"

#include <utility>

#include "core/error.h"
#include "core/ops/factory.h"

namespace kiln::compiler {

Tensor constant_tensor(const Node& node) {
  const TensorType& type = node.outputs.at(0);
  Tensor t = scalar_tensor(node.attrs.scalar("value"), type.dtype, type.device);
  t.impl()->wrapped_number = type.wrapped_number;
  return t;
}

RandomBase random_base(const Graph& graph, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < graph.inputs().size() && i < inputs.size(); ++i) {
    if (graph.node(graph.inputs()[i]).role != InputRole::random) continue;
    const Tensor base = inputs[i].contiguous();
    const int64_t* words = base.data_ptr<int64_t>();
    return RandomBase{.given = true, .seed = static_cast<uint64_t>(words[0]), .offset = static_cast<uint64_t>(words[1])};
  }
  return {};
}

Tensor random_base_tensor(uint64_t seed, uint64_t offset) {
  return from_vector(std::vector<int64_t>{static_cast<int64_t>(seed), static_cast<int64_t>(offset)}, {2},
                     {.dtype = DType::i64});
}

TensorType random_base_type() { return TensorType{.dtype = DType::i64, .shape = {2}}; }

const Attrs& call_attrs(const Node& node, const RandomBase& base, Attrs& scratch, const char* who) {
  if (!node.def || !node.def->random || node.attrs.has("seed")) return node.attrs;
  KILN_CHECK(base.given, "{}: random op {} draws from the graph's random input, which the graph lacks", who,
             node.op);
  scratch = node.attrs;
  scratch.set("seed", static_cast<int64_t>(base.seed));
  scratch.set("offset", static_cast<int64_t>(base.offset + static_cast<uint64_t>(node.attrs.i("offset"))));
  return scratch;
}

void check_inputs(const Graph& graph, const std::vector<Tensor>& inputs, const char* who) {
  KILN_CHECK(inputs.size() == graph.inputs().size(), "{}: the graph has {} inputs, got {} tensors", who,
             graph.inputs().size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value v = graph.inputs()[i];
    const Tensor& t = inputs[i];
    const TensorType& type = graph.type(v);
    KILN_CHECK(t.defined() && t.dtype() == type.dtype && t.shape() == type.shape && t.device() == type.device,
               "{}: input %{} \"{}\" expects {}, got {}", who, graph.value_number(v), graph.node(v).name,
               type.str(), t.defined() ? t.meta_str() : "an undefined tensor");
  }
}

std::vector<Tensor> finish_run(const Graph& graph, const std::vector<Tensor>& inputs,
                               const std::function<Tensor(Value)>& value) {
  std::vector<std::pair<Tensor, Tensor>> writes;
  for (const auto& [input, new_value] : graph.write_backs()) {
    Tensor v = value(new_value);
    if (v.same(value(input))) continue;  // computed in place (Program's memory plan)
    for (const Tensor& in : inputs)
      if (in.storage() == v.storage()) {
        v = v.clone();
        break;
      }
    writes.emplace_back(value(input), v);
  }
  for (auto& [target, v] : writes) target.copy_(v);

  std::vector<Tensor> outputs;
  outputs.reserve(graph.outputs().size());
  for (Value v : graph.outputs()) {
    Tensor out = value(v);
    for (const auto& [input, new_value] : graph.write_backs())
      if (new_value == v) {
        out = value(input);
        break;
      }
    outputs.push_back(out);
  }
  return outputs;
}

}  // namespace kiln::compiler
