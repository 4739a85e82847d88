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
// - batch_norm in training with running statistics (which its kernel updates in place) is
//   recorded as the pure batch_norm_update(input, weight, bias, running_mean, running_var)
//   {training, momentum, eps}: batch_norm's three outputs and the statistics' new values,
//   written back into them when they are graph inputs; a module's
//   num_batches_tracked.add_(1) is an in-place op like any other;
// - the optimizers' in-place updates (sgd_update_, adamw_update_: registry ops whose
//   hyperparameters are the groups' 0-d tensors) are recorded as their pure twins
//   (sgd_update, adamw_update) plus write-backs into every parameter and state tensor. An
//   optimizer's first step, which creates its state inside fn, is refused: run the first
//   step eagerly, then every compiled step has the same graph;
// - fn's results are the graph's outputs;
// - a `.grad` that fn changed (backward() assigning a new gradient to a leaf: AccumulateGrad's
//   clone when .grad was undefined) is a "grad effect": its new value is an extra graph
//   output after fn's results, applied by set_grad at replay (Trace::replay). A gradient
//   added into in place (.grad defined before) is a captured state input with a write-back,
//   and is read at replay from the leaf's current .grad (Trace::grad_of);
// - a random op (dropout, rand, randn, randint, normal_...) that drew its counters from the
//   default generator is a node without its seed and with its offset counted from the
//   trace's start (compiler/ir/graph.h), drawing from the graph input "random" (role random,
//   i64[2]: seed, base offset; Trace::random_input). replay() reserves Trace::random_count
//   counters (all that fn drew from the default generator) and gives their seed and first
//   offset as that input: each call gets fresh numbers, the very ones eager code would have
//   drawn, and leaves the generator where eager code would. inputs_for() gives the trace's
//   own base, so interpret(graph, inputs_for(args)) repeats the traced call's numbers.
//
// - a value read on the host (item()) of a graph input fn had not written (a
//   hyperparameter, a flag, an argument) is a guard (Trace::host_reads): eager code may
//   have branched on it, so the graph holds for that value only and another value traces
//   again. A host read of a value computed in the step (loss.item(), a counter fn added to
//   first) is refused as "item": the graph cannot hold what eager code made of the number.
//   So is a read through a view of an input (hp[0].item()): the guard reads whole inputs.
//   Other reads through data_ptr() are not seen unless they report themselves
//   (report_host_read: clip_grad_norm_ does, so clipping inside a step is a break).
//
// Refused with a kiln::Error naming the op, for now: random ops given another generator
// than the default one, reseeding the default generator inside fn, ops that mutate inputs
// in place other than through an in-place call (batch_norm aside), in-place writes into a
// view, and tensors modified outside the registry while tracing (a version counter moved
// with no op seen: a kernel written as a raw loop over data_ptr, say). With
// TraceOptions::allow_break a refusal is not thrown:
// the trace stops recording, fn runs on eagerly to its end, and the Trace reports the
// break (Trace::broken()) with no usable graph.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "core/tensor.h"

namespace kiln::compiler {

using TracedFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct TraceOptions {
  // Names for captured tensors, by identity: model.named_parameters(), optimizer state...
  std::map<const TensorImpl*, std::string> names{};
  // A refusal ends recording instead of throwing (fn still runs once, fully, eagerly).
  bool allow_break = false;
  // With allow_break: after the break, record the rest of the call piece by piece, as a
  // split run would split it (Trace::after_break; explain() reports it).
  bool record_after_break = false;
};

// A leaf's .grad that the traced function replaced: graph input `input` (an argument or a
// captured tensor) gets the value `value` as its new .grad; `value` none means cleared.
struct GradEffect {
  int64_t input = 0;
  Value value;
};

// One piece of a split run (see run_split below), or of what followed a traced call's break.
struct SplitPiece {
  int64_t ops = 0;     // op nodes recorded
  uint64_t hash = 0;   // the piece graph's structural hash
  std::string end;     // what ended it: "item", a refused op's name, "return", ...
  std::string reason;  // for a break (a refused op or host read), the tracer's refusal
  std::string graph;   // the piece's printed graph, in a trace's record after its break
};

struct Trace {
  Graph graph;
  int64_t num_args = 0;           // the first graph inputs are fn's arguments
  std::vector<Tensor> captured;   // the tensors behind the other graph inputs, in order
  std::vector<Tensor> results;    // what fn returned during the trace (eager values)
  int64_t num_results = 0;        // graph outputs: fn's results, then one per grad effect

  // Per graph input: for a leaf that requires grad, whether its .grad was defined when the
  // trace first saw it (the graph depends on it: AccumulateGrad clones or adds); nullopt
  // for other tensors.
  std::vector<std::optional<bool>> grad_defined;
  // The same when fn was called (the guard compile() checks): it differs from
  // grad_defined for a leaf whose .grad fn cleared (zero_grad) before first using it.
  std::vector<std::optional<bool>> grad_defined_at_call;
  // Per graph input: the index of the graph input whose .grad this tensor was when
  // captured (a gradient accumulated in place), -1 otherwise.
  std::vector<int64_t> grad_of;
  std::vector<GradEffect> grad_effects;
  // The graph input the random ops draw from (-1: none), and how many counters fn drew from
  // the default generator while traced: replay() reserves as many and passes their base.
  int64_t random_input = -1;
  uint64_t random_count = 0;
  // Values fn read on the host (item()) from graph inputs it had not written, in order of
  // first read: the graph was made for these values (see above).
  struct HostRead {
    int64_t input = 0;
    Scalar value;
  };
  std::vector<HostRead> host_reads;

  // Set when recording stopped at a refusal (TraceOptions::allow_break): the op that was
  // refused ("" for a write seen only at the end) and the refusal's message. The graph is
  // then incomplete and must not be run.
  std::string break_op;
  std::string break_reason;
  bool broken() const { return !break_reason.empty(); }
  // With TraceOptions::record_after_break: the pieces of the call after the break (each
  // ending at a further break or at fn's return), their graphs printed.
  std::vector<SplitPiece> after_break;

  // The tensors to pass to interpret(): args, then the captured tensors, where a captured
  // gradient is read from its leaf's current .grad (grad_of).
  std::vector<Tensor> inputs_for(const std::vector<Tensor>& args) const;

  // Runs the graph on new arguments as fn would, through interpret(): replay_inputs, the
  // graph, replay_results. Returns fn's results only.
  std::vector<Tensor> replay(const std::vector<Tensor>& args) const;
  // A replay in two halves, around any runner of `graph` (or of an equivalent optimized
  // graph with the same inputs and outputs: kiln::compile's generated program).
  // replay_inputs: inputs_for(args), with random_count counters reserved from the default
  // generator as the random input's base (fresh numbers, the generator left where eager code
  // leaves it). replay_results: given those inputs and the graph's outputs, applies the grad
  // effects (set_grad) and returns fn's results.
  std::vector<Tensor> replay_inputs(const std::vector<Tensor>& args) const;
  std::vector<Tensor> replay_results(const std::vector<Tensor>& inputs, std::vector<Tensor> outputs) const;
};

// Runs fn(args) once, eagerly, recording it. The results returned are the eager ones.
Trace trace(const TracedFunction& fn, const std::vector<Tensor>& args, const TraceOptions& options = {});

// Split runs: fn run with its op calls deferred and recorded, in pieces. Where a function
// cannot be one graph (it reads a value it computed on the host, calls an op the tracer
// refuses), it still runs compiled between those points: each call runs fn under the
// registry's DeferHook, so ops compute nothing when called (their outputs are pending
// tensors, core/storage.h) and are recorded into a piece's graph as trace() records them.
// The piece ends when
// - fn reads on the host (item(), a reported read) a value the piece computes or writes,
//   or reads a pending tensor's memory (data_ptr()): the piece runs, the read sees its value;
// - an op call is refused by the tracer: the piece runs, then that call runs eagerly;
// - fn returns (or throws).
// Running a piece: its graph's outputs are the values of the pending tensors still alive
// (held by fn's variables, autograd's saved tensors, a leaf's .grad), which take the
// results' memory (or a copy of them); its write-backs update the tensors fn wrote in place.
// So each call records the pieces afresh, as eager code runs (its branches, its numbers),
// and runs each through `run_piece` (the compiler caches programs by the piece graph's
// structural hash). Tensors fn writes through data_ptr() are not seen, and a data_ptr()
// read of a tensor a pending piece writes in place sees its old content.
using PieceRunner = std::function<std::vector<Tensor>(const Graph& graph, const std::vector<Tensor>& inputs)>;
// Runs fn(args) split; returns fn's results (computed) and, in `pieces`, what ran.
std::vector<Tensor> run_split(const TracedFunction& fn, const std::vector<Tensor>& args, const TraceOptions& options,
                              const PieceRunner& run_piece, std::vector<SplitPiece>* pieces = nullptr);

// Runs a graph on real tensors through the eager ops, without recording autograd: the
// reference the compiled runtime is tested against. `inputs` are the tensors of the graph
// inputs in order (types must match: kiln::Error naming the input otherwise). Write-backs
// are copied into their input tensors in place; returns the outputs (an output that is the
// new content of an input is that input tensor, as the in-place op returned it eagerly).
std::vector<Tensor> interpret(const Graph& graph, const std::vector<Tensor>& inputs);

}  // namespace kiln::compiler
