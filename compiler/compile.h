#pragma once
// kiln::compile: the user-facing entry point of the compiler (../shared/COMPILER.md).
//
//   auto step = kiln::compile([&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
//     Tensor loss = mse_loss(model(a[0]), a[1]);
//     loss.backward();
//     return {loss};
//   });
//   for (...) { model.zero_grad(); Tensor loss = step({x, y})[0]; opt.step(); }
//
// The first call traces fn (compiler::trace: one eager run recorded into a graph), simplifies
// the graph (compiler/passes/passes.h), fuses it and compiles its kernels
// (compiler/program.h); later calls whose guards hold run that program (or, with
// backend "interpreter", the traced graph through the reference interpreter) without
// running fn. Guards: each argument's dtype,
// shape, device, strides class (contiguous, channels-last, other) and requires_grad, and
// whether a leaf argument's .grad is defined; grad mode; for every captured tensor its
// dtype, shape, device and strides class and, for a leaf that requires grad, whether its
// .grad is defined; which arguments and captured tensors share memory. A call whose guards
// fail traces again; its graph is cached beside the others.
//
// What the graph reads at each call:
// - the arguments, and the captured tensors (parameters, optimizer state, 0-d
//   hyperparameters such as an lr tensor) through the handles the trace saw: changing their
//   VALUES in place (copy_, fill_, an optimizer's update) never recompiles. Rebinding a
//   variable that fn captured to a new tensor is not seen (the cache keeps the old one),
//   nor is a tensor that fn makes outside the op registry (from host data); numbers fn
//   reads on the host (item(), a C++ double) are baked into the graph;
// - a gradient accumulated in place: the leaf's current .grad.
// Side effects replayed: write-backs into arguments and captured tensors (in-place ops),
// and grad effects (backward() assigning a leaf's .grad: set_grad to the new gradient).
// Results of replayed calls carry no autograd history; the traced (first) call returns
// fn's eager results.
//
// Random ops (dropout in training, randn...) drawing from the default generator are traced:
// each replay draws fresh counters from it, as eager code would (compiler/trace.h).
//
// Graph breaks: the tracer refuses some programs (random ops given another generator,
// in-place writes into views, an optimizer's first step (it creates state), writes
// outside the op registry, a value computed in the step read on the host). With
// `fullgraph` the refusal is thrown as a kiln::Error naming the op, from the middle of fn:
// the ops before the refused one (and the refused one itself) already ran eagerly. Without
// it, tracing just stops recording at the refusal and fn runs on, eagerly, to its end --
// so the call that found the break ran fn exactly once, as eager code would -- and later
// calls matching that entry's guards run fn split (compiler/trace.h, run_split): fn runs
// with its ops deferred and recorded, and the pieces between the breaks (host reads of
// computed values, refused ops) run as compiled programs, cached by their graph's hash.
//
// A leaf's .grad guard is its state when fn was called: a step that clears gradients itself
// (optimizer.zero_grad() with set_to_none, first thing in fn) traces once for .grad
// defined at the call and replays from then on (the tracer hears set_grad, so it knows the
// state before fn cleared it).
//
// Not thread-safe: call one CompiledFunction from one thread at a time.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compiler/passes/passes.h"
#include "compiler/trace.h"

namespace kiln::compiler {

class GraphRecorder;  // compiler/cuda_graph.h

struct CompileOptions {
  // Throw the tracer's refusal instead of falling back to eager code.
  bool fullgraph = false;
  // "default"; "reduce-overhead": each cached graph's program is captured as a CUDA graph
  // and replayed, one launch per call instead of one per kernel and library op
  // (compiler/cuda_graph.h: the arguments and accumulated gradients are copied in, results
  // copied out; a program on the CPU, or one a graph cannot hold, runs as in the default
  // mode and cuda_graphs() says why); "max-autotune": reduce-overhead, and on a GPU each
  // generated pointwise kernel's launch (block size, grid cap) is chosen by timing at its
  // first run and cuDNN times its convolution algorithms for the program's calls
  // (autotune_report()); on the CPU nothing is tuned yet (it runs as the default mode). Any
  // other name is a kiln::Error.
  std::string mode = "default";
  // What runs a replay: "generated" (the compiled program) or "interpreter" (the traced
  // graph through compiler::interpret: the reference, for tests and debugging). Any other
  // name is a kiln::Error.
  std::string backend = "generated";
  // Where each new graph's stages are written, numbered per process: NNN-trace.ir; with the
  // generated backend also NNN-simplified.ir, NNN-passes.txt (the passes' timing table),
  // NNN-fused.txt (the program's steps), NNN-kernels.txt (each kernel's IR) and
  // NNN-source.cpp (the generated C++). Empty: $KILN_DUMP when set, else no dumps.
  std::filesystem::path dump_dir{};
  // Past this many recompiles a warning naming what changed is printed once to stderr.
  int64_t recompile_limit = 8;
  // At most this many cached graphs (and graph breaks); past it, a call that matches none
  // runs fn eagerly without tracing (eager_fallbacks() counts them; a warning once).
  int64_t cache_limit = 32;
  // Names for captured tensors (model.named_parameters(), ...), used in graphs and messages.
  TraceOptions trace{};
  // Where the layout pass runs convolutions channels-last (compiler/passes/passes.h):
  // automatic (every device's convolution regions), keep, or channels_last.
  LayoutPolicy layout = LayoutPolicy::automatic;
  // Where a training batch norm and its backward become statistics ops plus fused pointwise
  // work (split_batch_norm, compiler/passes/passes.h): on CUDA (the default), always or
  // never. The environment's KILN_BATCH_NORM_SPLIT=cuda|always|never overrides it (how the
  // CPU choice was measured with kiln-bench).
  BatchNormSplit batch_norm_split = BatchNormSplit::cuda;
  // Whether a language model's head and loss (matmul, bias, log_softmax, nll_loss and their
  // backward) become linear_cross_entropy, whose products skip ignored targets
  // (fuse_linear_cross_entropy, compiler/passes/passes.h). The environment's
  // KILN_LINEAR_CROSS_ENTROPY=0|1 overrides it (to measure the choice).
  bool linear_cross_entropy = true;
  // Where a Linear's tanh GELU or ReLU (and the GELU's backward with the bias gradient) run
  // in cuBLASLt's epilogues (gemm_activations, compiler/passes/passes.h): on CUDA (the
  // default), always or never. The environment's KILN_GEMM_ACTIVATIONS=cuda|always|never
  // overrides it.
  GemmActivations gemm_activations = GemmActivations::cuda;
  // Time every step of the generated programs (see CompiledFunction::profile); also on when
  // the environment sets KILN_PROFILE=1.
  bool profile = false;
  // For tests of mode reduce-overhead on machines without a GPU: what captures and replays
  // the programs instead of CUDA graphs (compiler/cuda_graph.h), on any device. Unset: CUDA.
  std::function<std::unique_ptr<GraphRecorder>()> graph_recorder{};
};

// What mode reduce-overhead did: graphs captured (recaptures included), replays, runs of a
// program without a graph (the warm-up run of each, and the programs that cannot be
// captured), why programs were not captured (distinct reasons), and the bytes of the
// graphs' memory pools.
struct CudaGraphStats {
  int64_t captures = 0, replays = 0, uncaptured_runs = 0;
  std::vector<std::string> skipped;
  int64_t pool_bytes = 0;
};

class CompiledFunction {
 public:
  // Runs fn: replays a cached graph whose guards hold, else traces (or runs eagerly for an
  // entry that found a graph break).
  std::vector<Tensor> operator()(const std::vector<Tensor>& args);

  int64_t recompiles() const;  // traces after the first
  int64_t cache_size() const;  // cached entries, graph breaks included
  int64_t calls() const;
  int64_t graph_breaks() const;  // cached entries that found a graph break (they run split)
  int64_t eager_fallbacks() const;  // calls run eagerly because the cache was full
  // Calls of entries with a graph break, which run fn split (compiler/trace.h, run_split);
  // the distinct piece programs compiled for them; the pieces of the last such call.
  int64_t split_calls() const;
  int64_t piece_programs() const;
  std::vector<SplitPiece> last_split() const;
  // The reason of the last recompile ("arg0's shape changed from [8,3] to [9,3]"); "" if none.
  std::string last_recompile_reason() const;
  // The recompile-limit warning once printed; "" before the limit was passed.
  std::string warning() const;
  // The graphs of the cached entries, in cache order (broken entries hold an empty graph).
  std::vector<const Trace*> traces() const;
  // With CompileOptions::profile: per cached graph, where a replay's time goes (per kernel
  // and library op; Program::profile).
  std::string profile() const;
  // Mode reduce-overhead's (and max-autotune's) CUDA graphs (all zero in the default mode).
  CudaGraphStats cuda_graphs() const;
  // max-autotune: per cached graph, the kernels whose launches were timed, what was chosen,
  // its time and the default launch's ("" in the other modes).
  std::string autotune_report() const;

 private:
  friend CompiledFunction compile(TracedFunction fn, CompileOptions options);
  struct State;
  std::shared_ptr<State> state_;  // copies share one cache
};

// Wraps fn; nothing is traced before the first call. kiln::Error for an unknown mode.
CompiledFunction compile(TracedFunction fn, CompileOptions options = {});

// Traces fn(args) once (running it eagerly once: its side effects happen) and reports what
// compile would make of it: graphs and graph breaks (with the refused op and why), node
// counts, inputs by role, outputs, write-backs, grad effects and the printed graph.
// A break is reported, not thrown, even with options.fullgraph.
std::string explain(TracedFunction fn, const std::vector<Tensor>& args, CompileOptions options = {});

}  // namespace kiln::compiler

namespace kiln {
using compiler::CompiledFunction;
using compiler::CompileOptions;
using compiler::CudaGraphStats;
using compiler::compile;
using compiler::explain;
using compiler::TracedFunction;
using compiler::TraceOptions;
}  // namespace kiln
