#pragma once
// What every runner of a graph does the same way, shared by the reference interpreter
// (compiler/interpret.cpp) and the generated program (compiler/program.cpp): checking the
// input tensors, materializing constants, and finishing a run (write-backs, then outputs).
#include <functional>
#include <vector>

#include "compiler/ir/graph.h"

namespace kiln::compiler {

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
