#pragma once
// What every runner of a graph does the same way, shared by the reference interpreter
// (compiler/interpret.cpp) and the generated program (compiler/program.cpp): checking the
// input tensors, materializing constants, and finishing a run (write-backs, then outputs).
#include <cstdint>
#include <functional>
#include <vector>

#include "compiler/ir/graph.h"

namespace kiln::compiler {

// The random base a run's random nodes draw from (graph.h): the seed and the first Philox
// counter, read from the graph's random input; nothing when the graph has none.
struct RandomBase {
  bool given = false;
  uint64_t seed = 0;
  uint64_t offset = 0;
};
RandomBase random_base(const Graph& graph, const std::vector<Tensor>& inputs);
// The tensor a random input holds: i64[2] on the CPU, {seed, offset} (their bits).
Tensor random_base_tensor(uint64_t seed, uint64_t offset);
TensorType random_base_type();

// The attributes a node's kernel runs with: its own, except for a random node without a
// seed, whose seed is the base's and whose offset is the base's plus its own (built in
// `scratch`). kiln::Error naming `who` and the op when such a node has no base.
const Attrs& call_attrs(const Node& node, const RandomBase& base, Attrs& scratch, const char* who);

// A 0-d tensor holding a constant node's value, typed exactly as the node says.
Tensor constant_tensor(const Node& node);

// Checks that `inputs` match the graph inputs in count, dtype, shape and device (layout is
// a strides class the compiled code guards on; the eager ops take any). Errors start with
// `who` ("interpret", "Program::run") and name the input.
void check_inputs(const Graph& graph, const std::vector<Tensor>& inputs, const char* who);

// Ends a run given each value's tensor: copies every write-back into its input tensor (all
// reading the values as they were before any is written: a value over an input's memory
// is copied out first), then returns the graph's outputs, a written-back value being
// returned as its input tensor, as the eager in-place op did.
std::vector<Tensor> finish_run(const Graph& graph, const std::vector<Tensor>& inputs,
                               const std::function<Tensor(Value)>& value);

}  // namespace kiln::compiler
