#pragma once
// The graph IR: what the tracer records and every pass rewrites (../shared/COMPILER.md).
//
// A Graph is a pure SSA program over tensors. Nodes are graph inputs, 0-d constants and
// calls of registry ops (compute and view ops alike; a view stays a node and becomes index
// arithmetic later). Nothing mutates: an in-place op is traced as the pure op plus a
// write-back ("this value is the new content of that input"), which the memory planner
// makes free. Nodes are hash-consed: adding a node identical to an existing one (same op,
// attributes and inputs, and not random) returns the existing node, so common
// subexpressions never exist.
//
// Text form, one node per line, printed by print() and read back by parse():
//
//   %0 = input "x" : f32[8,3,32,32]
//   %1 = param "conv1.weight" : f32[64,3,7,7]
//   %2 = scalar "lr" : f64[]
//   %3 = conv2d(%0, %1, none) {stride=[2,2], padding=[3,3], dilation=[1,1], groups=1} : f32[8,64,16,16]  # conv2d
//   %4 = constant {value=$2} : f64[] number
//   %5 = mul(%3, %4) : f32[8,64,16,16]  # mul
//   %6, %7 = max_pool2d_with_indices(%5) {...} : f32[8,64,8,8], i64[8,64,8,8]  # max_pool2d
//   return %6
//   write %1 <- %9
//
// Values are numbered densely in definition order (%0, %1, ...), so a printed graph is
// stable and two dumps of the same model diff cleanly. `none` is an absent optional input.
// The comment after `#` is the node's source (what the traced program called).
//
// Random ops (OpDef::random: dropout, uniform, normal, randint) draw Philox counters from
// the run's random base, the graph input of role `random` (i64[2] on the CPU: seed, first
// counter), given afresh at each run (Trace::replay reserves it from the default
// generator). Their nodes have no `seed` attribute and an `offset` counted from the base, so
// the graph, and its hash, do not change with the seed or the stream's position:
//
//   %1 = random "random" : i64[2]
//   %2, %3 = dropout(%0) {p=0.3, train=true, offset=0} : f32[4,8], bool[4,8]
//   %4 = normal() {shape=[4,8], dtype=f32, device=cpu, offset=32, mean=0.0, std=1.0} : f32[4,8]
//
// The runners call the kernel with seed = the base's seed and offset = the base's offset +
// the node's. (A node that keeps a `seed` attribute, built by hand, runs with its own.)
//
// Attribute values print with their type visible, so parse() rebuilds them exactly:
// true/false (bool), 3 (int), 1.5 / 1e-05 / inf / nan (double: always with '.', 'e' or a
// word), $2 / $2.5 / $true (Scalar), [1,2] (ints), f32 (DType), cpu / cuda:0 (Device),
// "text" (string, with \" and \\ escaped).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln::compiler {

// The strides class of a value: row-major contiguous, or channels-last (NHWC) for 4-d.
struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  Device device;
  MemoryFormat layout = MemoryFormat::contiguous;  // core/tensor.h's, as eager tensors say it
  bool wrapped_number = false;  // a 0-d tensor made from a number (type promotion treats it weakly)
  bool defined = true;          // false: an absent optional input

  static TensorType of(const Tensor& t);  // layout from t's strides
  static TensorType of(const TensorMeta& m);
  TensorMeta meta() const;
  MemoryFormat memory_format() const { return layout; }
  // "f32[8,64,112,112]", then " nhwc", " number" and " cuda:0" (devices other than cpu)
  // when they apply; "none" when undefined.
  std::string str() const;
  bool operator==(const TensorType&) const = default;
};

// One SSA value: output `output` of node `node`. A default Value is `none`.
struct Value {
  int32_t node = -1;
  int32_t output = 0;
  bool defined() const { return node >= 0; }
  auto operator<=>(const Value&) const = default;
};

enum class NodeKind : uint8_t { input, constant, op };
// What a graph input is, printed as its keyword: input (data given at each call), param
// (a parameter), state (optimizer or module state such as momentum or running_mean),
// scalar (a 0-d runtime hyperparameter: lr, loss scale, accumulation weight), random (the
// random ops' base: seed and first counter, above).
enum class InputRole : uint8_t { data, param, state, scalar, random };
// The role's keyword in the IR text and in messages: "input", "param", "state", "scalar",
// "random"; role_of reads one back (nothing for another word).
const char* role_name(InputRole role);
std::optional<InputRole> role_of(std::string_view keyword);

struct Node {
  NodeKind kind = NodeKind::op;
  std::string op;                   // the registry op for op nodes ("input"/"constant" otherwise)
  const OpDef* def = nullptr;       // op nodes only
  std::vector<Value> inputs;        // op nodes only; may hold `none`
  Attrs attrs;                      // op nodes; constants hold {value=<Scalar>}
  std::vector<TensorType> outputs;  // one per output value
  InputRole role = InputRole::data;  // input nodes only
  std::string name;                 // input nodes: the stable user-facing name
  std::string source;               // what the traced program called ("relu", "relu backward", ...)
};

class Graph {
 public:
  // A graph input. Names must be unique among inputs (kiln::Error otherwise).
  Value add_input(std::string name, TensorType type, InputRole role = InputRole::data);
  // A constant 0-d tensor of `type` (shape []) holding `value`; hash-consed like ops.
  Value add_constant(Scalar value, TensorType type);
  // Adds a call of registry op `op`. Output types come from the op's shape rule applied to
  // the inputs' types; a rule's kiln::Error propagates. An identical non-random node
  // already in the graph is returned instead of a new one.
  std::vector<Value> add_op(std::string_view op, std::vector<Value> inputs, Attrs attrs = {},
                            std::string source = {});
  // add_op for ops with exactly one output.
  Value add_op1(std::string_view op, std::vector<Value> inputs, Attrs attrs = {}, std::string source = {});
  // Records that `value` is the new content of graph input `input` after a call (same
  // type; kiln::Error otherwise). A later write-back to the same input replaces it.
  void add_write_back(Value input, Value value);
  void set_outputs(std::vector<Value> outputs);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(Value v) const;
  const TensorType& type(Value v) const;
  const std::vector<Value>& inputs() const { return inputs_; }
  const std::vector<Value>& outputs() const { return outputs_; }
  // (input, new value) pairs, in the order first recorded.
  const std::vector<std::pair<Value, Value>>& write_backs() const { return write_backs_; }
  // The dense number of a value in definition order (its %N in the text form).
  int64_t value_number(Value v) const;
  int64_t num_values() const { return num_values_; }

  // A hash of the whole program (nodes, types, attributes, outputs, write-backs; not the
  // source comments), equal for graphs that print the same apart from comments.
  uint64_t structural_hash() const;

 private:
  Value append(Node node);
  std::vector<Node> nodes_;
  std::vector<int64_t> first_value_;  // per node: the number of its first output value
  int64_t num_values_ = 0;
  std::vector<Value> inputs_;
  std::vector<Value> outputs_;
  std::vector<std::pair<Value, Value>> write_backs_;
  std::unordered_map<std::string, int32_t> interned_;  // node key -> node index
};

// The typed text of an attribute value ("$2.5", "[1,2]", "1e-05") and of a node's
// attributes ("{stride=[2,2], alpha=$1}"; "" when there are none).
std::string attr_text(const AttrValue& value);
std::string attrs_text(const Attrs& attrs);

// The text form described at the top of this file; without the `# source` comments when
// with_sources is false.
std::string print(const Graph& graph, bool with_sources = true);
// Reads the text form back; errors are kiln::Errors naming the line ("graph line 4: ...").
// Op nodes are re-added through Graph::add_op, so their printed types are checked against
// the shape rules.
Graph parse(std::string_view text);
// Checks the invariants every pass must keep: inputs defined before use, each op node's
// output types equal to its shape rule's answer for its inputs' types, outputs and
// write-backs referring to existing values, write-backs only to inputs and type-equal, at
// most one random input (i64[2] on the CPU), present when a random node draws from it.
// Throws kiln::Error naming the first broken node.
void verify(const Graph& graph);

}  // namespace kiln::compiler
