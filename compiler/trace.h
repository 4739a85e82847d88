#pragma once
// The tracer: runs a function once, eagerly, and records every registry op it calls into a
// Graph (compiler/ir/graph.h), through the op registry's one tracing hook. Autograd's
// backward formulas are ordinary ops, so a function that calls backward() is traced with
// its backward pass.
//
//   compiler::Trace t = compiler::trace(fn, {x, y});
//   std::vector<Tensor> out = compiler::interpret(t.graph, t.inputs_for({x, y}));
//
// What becomes what:
// - fn's arguments are graph inputs "arg0", "arg1", ... (role data);
// - any other tensor an op reads that the trace has not produced is captured: a graph input
//   named from TraceOptions::names when given, else "captured0", ... (role param for leaves
//   that require grad, scalar for 0-d floating CPU tensors, state otherwise); numbers
//   written in the program (wrapped 0-d tensors) become constants;
// - an in-place op (add_, copy_, ...) is recorded as the pure op, and when its target is a
//   graph input, as a write-back to it;
// - fn's results are the graph's outputs.
//
// Refused with a kiln::Error naming the op, for now: random ops (their seed and offset would
// be baked in), ops that mutate inputs in place other than through an in-place call (batch
// norm's running statistics in training), in-place writes into a view, and tensors
// modified outside the registry while tracing (a version counter moved with no op seen:
// an optimizer's fused step, say).
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "core/tensor.h"

namespace kiln::compiler {

using TracedFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct TraceOptions {
  // Names for captured tensors, by identity: model.named_parameters(), optimizer state...
  std::map<const TensorImpl*, std::string> names;
};

struct Trace {
  Graph graph;
  int64_t num_args = 0;           // the first graph inputs are fn's arguments
  std::vector<Tensor> captured;   // the tensors behind the other graph inputs, in order
  std::vector<Tensor> results;    // what fn returned during the trace (eager values)

  // The tensors to pass to interpret(): args, then the captured tensors.
  std::vector<Tensor> inputs_for(const std::vector<Tensor>& args) const;
};

// Runs fn(args) once, eagerly, recording it. The results returned are the eager ones.
Trace trace(const TracedFunction& fn, const std::vector<Tensor>& args, const TraceOptions& options = {});

// Runs a graph on real tensors through the eager ops, without recording autograd: the
// reference the compiled runtime is tested against. `inputs` are the tensors of the graph
// inputs in order (types must match: kiln::Error naming the input otherwise). Write-backs
// are copied into their input tensors in place; returns the outputs.
std::vector<Tensor> interpret(const Graph& graph, const std::vector<Tensor>& inputs);

}  // namespace kiln::compiler
