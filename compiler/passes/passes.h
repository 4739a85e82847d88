#pragma once
// Graph passes (../../shared/COMPILER.md, "Passes as rules"). Each takes a graph and returns
// a new, valid one (verify() holds) computing the same outputs and write-backs from the same
// inputs; given a log, each appends one line per rewrite it made (compiler/passes/rewrite.h).
//
//   std::vector<PassRecord> records;
//   Graph g = run_pipeline(traced, default_simplify_passes(), &records);
//   std::cout << timing_table(records);
#include <functional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/passes/rewrite.h"

namespace kiln::compiler {

// Per node: whether it is a graph input or its values reach an output or a write-back.
std::vector<bool> live_nodes(const Graph& graph);

// Whether value v is laid out row-major as its type says, as far as the graph shows: not a
// strided view (a permute, slice, expand...) nor a reshaping view of one, so a rule may view
// it in another shape.
bool dense(const Graph& graph, Value v);

// Drops the nodes whose values reach neither an output nor a write-back. Graph inputs always
// stay: they are the calling convention. Logs one line per node dropped.
Graph dead_code(const Graph& graph, RewriteLog* log = nullptr);

// Evaluates op nodes whose inputs are all constants and whose one output is 0-d (a
// `full` with shape [] among them) into constants of exactly the node's type, through
// the eager kernels, so the value is the one the program would have computed. Random ops,
// `empty` and nodes off the CPU are left alone. The constants it no longer reads stay, for
// dead_code (so a pipeline's table shows which pass removed what).
Graph fold_constants(const Graph& graph, RewriteLog* log = nullptr);
const std::vector<Rule>& fold_rules();

// Algebra and view identities, each applied only where the result has exactly the replaced
// value's type: x+0, 0+x, x-0, x*1, 1*x, x/1 (a constant exactly 0 or 1 in its dtype),
// neg(neg(x)), clone(x) (the graph is pure: a copy is the value), view/expand/cast to the
// same type, identity permutes, permute(permute(x)) and view(view(x)) into one view of x.
// The nodes it bypassed stay, for dead_code to drop.
Graph simplify(const Graph& graph, RewriteLog* log = nullptr);
const std::vector<Rule>& simplify_rules();

// Rewrites ops that codegen cannot fuse into reductions and elementwise ops that it can, on
// CUDA values (the CPU keeps its eager layer-norm kernels, which measured faster than the
// generated reductions; decompose_rules() still apply anywhere, for the tests), computing
// what the eager kernel computes (its f64
// statistics, its compute type): layer_norm into two row reductions (mean, then the mean of
// squared deviations) and elementwise work, keeping its saved mean and rstd outputs;
// layer_norm_backward into row sums (dw, db), row means and elementwise work, so that the
// parts no one reads (dx when the input needs no gradient) vanish with dead_code. Logs one
// line per op rewritten.
Graph decompose(const Graph& graph, RewriteLog* log = nullptr);
const std::vector<Rule>& decompose_rules();

// A language model's head and its loss as one op (compiler/passes/linear_cross_entropy.cpp):
// matmul(x, permute(W)) [+ b] -> log_softmax -> nll_loss (no class weights, mean or sum),
// with their backward ops and the argmax count of correct predictions, becomes
// linear_cross_entropy and linear_cross_entropy_backward, whose products skip the rows whose
// target is ignored, where nothing else reads the chain's values (f32/f64 on the CPU, and on
// CUDA when `cuda`: the CUDA op reads the target back, a sync that a captured CUDA graph
// cannot hold). Agrees with the chain to rounding. Logs one line per replaced value.
Graph fuse_linear_cross_entropy(const Graph& graph, bool cuda = true, RewriteLog* log = nullptr);

// Additions a GEMM does itself (compiler/passes/epilogue.cpp): x + mm(a, b) (either side,
// matmul too, 2-d f32/f64 operands) where x has the sum's own type and nothing else reads
// the product becomes addmm(x, a, b), and x + conv2d_backward_weight(g, input) becomes
// conv2d_backward_weight(g, input, x), so gradient accumulation (`grad += g` of a Linear
// or convolution weight) and full-size residual adds need no temporary; a sum written back
// into x runs in place. Agrees with the add to rounding (the kernel adds x among its
// partial sums). Logs one line per rewrite.
Graph gemm_epilogues(const Graph& graph, RewriteLog* log = nullptr);

// Where gemm_activations applies: to values on CUDA devices (the default: cuBLASLt's
// epilogues save a pointwise kernel's pass over the product), on the CPU and CUDA (tests;
// kiln-ir's CUDA schedule traced on the CPU), or nowhere. On the CPU the activation is a
// pass over the product either way (docs/compiler.md, "GEMM epilogues").
enum class GemmActivations : uint8_t { cuda, always, never };
const char* gemm_activations_name(GemmActivations where);  // "cuda", "always", "never"

// A Linear's tanh GELU or ReLU, and the tanh GELU's backward through the next product, as
// cuBLASLt's epilogues (compiler/passes/epilogue.cpp): pre = matmul(x, W) + b (or addmm)
// read by gelu(pre) {tanh} becomes addmm_activation(b, x, W) -> (gelu, pre); relu(pre) with
// no other reader of pre becomes addmm_activation {relu}; gelu_backward(matmul(g, V), pre)
// {tanh} becomes mm_gelu_backward(g, V, pre) -> (grad_pre, grad_bias), whose grad_bias
// replaces the bias gradient's sum(grad_pre, every dim but the last). Products with other
// readers stay. Results agree to rounding. Logs one line per rewrite.
Graph gemm_activations(const Graph& graph, GemmActivations where, RewriteLog* log = nullptr);

// Where split_batch_norm applies: to values on CUDA devices (the default: there a separate
// pass over memory costs what the arithmetic does not), on every device with a code
// generator (tests; measurements on the CPU), or nowhere. docs/compiler.md says why the CPU
// keeps its batch-norm kernels.
enum class BatchNormSplit : uint8_t { cuda, always, never };
const char* batch_norm_split_name(BatchNormSplit split);  // "cuda", "always", "never"

// A training batch norm (batch_norm_update) becomes batch_norm_train_stats (per-channel
// statistics, the running statistics' update and the affine factors) plus a pointwise
// y = x * scale + shift, which fusion merges with the ReLU or residual add and ReLU after it;
// batch_norm_backward in training becomes batch_norm_grad_stats (the per-channel sums and
// dx's factors) plus a pointwise dx, into which ReLU's backward mask fuses: where grad_out is
// where(gt(r, 0), g, 0) read by nothing else, the sums read g and r themselves
// (compiler/passes/batch_norm_split.cpp). Logs one line per op rewritten.
Graph split_batch_norm(const Graph& graph, BatchNormSplit split, RewriteLog* log = nullptr);

// Where the layout pass runs a graph's convolutions channels-last (NHWC): automatic (on
// every device: on the CPU kiln's NHWC convolutions are GEMMs over the whole batch and
// oneDNN reads NHWC directly, which measured faster; on CUDA, cuDNN's tensor-core
// convolutions are NHWC, and the cost model (compiler/cost.h) plans a ResNet-50 step at
// 0.70x the NCHW one's time, 41 -> 29 ms on an H200, until a GPU measures it), keep (never)
// or channels_last (the same as automatic today; it names the choice explicitly).
enum class LayoutPolicy : uint8_t { automatic, keep, channels_last };
const char* layout_policy_name(LayoutPolicy policy);  // "auto", "keep", "channels_last"

// The layout pass (compiler/passes/layout.cpp): when the policy applies to a convolution of
// the graph, every convolution (groups == 1) reads its activations channels_last, through a
// clone {channels_last=true} where a value is not yet, and the other ops take the layout
// their shape rules give (elementwise, batch norm and pooling keep it), so the region runs
// NHWC; pooling gradients are told to keep it; view ops read region values through a
// contiguous copy; outputs and write-backs are copied back to their layout. Logs one line
// per node it changed.
Graph choose_layout(const Graph& graph, LayoutPolicy policy, RewriteLog* log = nullptr);
// choose_layout with LayoutPolicy::channels_last (the pass tests' entry).
Graph channels_last(const Graph& graph, RewriteLog* log = nullptr);
const std::vector<Rule>& layout_rules();

using PassFn = std::function<Graph(const Graph&, RewriteLog*)>;
struct NamedPass {
  std::string name;
  PassFn run;
};

// What one pass of a pipeline did.
struct PassRecord {
  std::string name;
  double ms = 0;
  int64_t nodes_before = 0, nodes_after = 0;
  std::vector<std::string> rewrites;
  std::string graph_after;  // print(graph) after the pass, when the pipeline keeps graphs
};

// Runs the passes in order, verifying the graph after each (kiln::Error naming the pass when
// one broke it). With `records`, appends one per pass, timed, with its rewrites and, when
// keep_graphs, the printed graph after it.
Graph run_pipeline(const Graph& graph, const std::vector<NamedPass>& passes,
                   std::vector<PassRecord>* records = nullptr, bool keep_graphs = true);

// {fold_constants, simplify, dead_code}.
std::vector<NamedPass> default_simplify_passes();
// What kiln::compile runs before fusion: {fold_constants, simplify,
// fuse_linear_cross_entropy (unless linear_cross_entropy is false; on CUDA values unless
// linear_cross_entropy_cuda is false), decompose,
// gemm_epilogues, gemm_activations, layout, split_batch_norm, dead_code}.
std::vector<NamedPass> default_compile_passes(LayoutPolicy layout = LayoutPolicy::automatic,
                                              BatchNormSplit batch_norm = BatchNormSplit::cuda,
                                              bool linear_cross_entropy = true,
                                              GemmActivations gemm_activations = GemmActivations::cuda,
                                              bool linear_cross_entropy_cuda = true);

// An aligned table: pass, ms, nodes before -> after, rewrites; then a total line.
std::string timing_table(const std::vector<PassRecord>& records);

}  // namespace kiln::compiler
