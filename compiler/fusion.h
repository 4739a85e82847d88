#pragma once
// Fusion: which nodes of a graph run together as one generated kernel
// (../shared/COMPILER.md, "Fusion").
//
// fuse() returns a schedule: every op node of the graph in exactly one group, the groups in
// node (topological) order. Each group is a contiguous run of the graph's op nodes (view
// nodes aside, see below), so running the groups in order never reads a value before it is
// computed and no cycle can arise. The kinds:
// - pointwise: op nodes of one output shape that lower_pointwise accepts, as one kernel
//   (several outputs when several of their values are used outside the run);
// - reduction: a reduction that lower_reduction accepts, with the pointwise nodes of the
//   run before it whose values only it reads (its private prologue), as one kernel; a run
//   of dtype conversions right after it (view steps between) over its input space, reading
//   nothing computed at or after it, joins it as side outputs that its inner loops store;
// - eager: one node run through the registry (call_op): matmul, convolution, pooling,
//   norms, losses and their backward ops, factories, and any op or dtype codegen refuses.
//   A GEMM or convolution (an op autocast lowers, CastPolicy::lower) whose result only a
//   cast reads, when no reader of the cast is a pointwise op that could take the cast into
//   its own kernel, takes the cast as its second node: the library call writes its result
//   in the cast's dtype (call_op_out; the CPU kernels accumulate in f32 and convert as they
//   store, so a bf16 weight gradient cast to f32 is the f32 sum, without the bf16 rounding
//   eager code makes in between). That is mixed precision's GEMM epilogue;
// - view: one view node run through call_op (cheap: no copy). A kernel never needs these
//   (it reads through the views of its inputs itself); they serve eager consumers, outputs
//   and write-backs.
// A view of a value produced outside the current pointwise run does not break the run (its
// step comes before the run's kernel); a view of a value the run produces ends the run,
// since a kernel cannot read its own result through a view. Likewise batch norm's statistics
// ops (batch_norm_train_stats, batch_norm_grad_stats: compiler/passes/passes.h,
// split_batch_norm) when they read no value of the run: their eager step comes before the
// run's kernel, which the pointwise work reading their results then joins (ReLU's backward
// mask and batch norm's input gradient in one kernel). That is the one exception to "groups
// in node order": the schedule stays a topological order.
//
// Membership follows the ops' registry entries: a node joins the run when the code
// generator lowers its op (codegen::lowers_pointwise), it has the run's shape and a value of
// the run with it is used outside it, which is when lower_pointwise accepts the run; a
// reduction takes its prologue when codegen::try_lower_reduction accepts the group. Each
// run is lowered once, when it ends, and the steps keep their kernels.
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_ir.h"
#include "compiler/ir/graph.h"

namespace kiln::compiler {

struct ScheduleStep {
  enum Kind : uint8_t { pointwise, reduction, eager, view };
  std::vector<int32_t> nodes;  // op nodes, in node order
  Kind kind = eager;
  codegen::Kernel kernel;  // pointwise and reduction groups: the lowered kernel

  bool is_kernel() const { return kind == pointwise || kind == reduction; }
  // An eager step whose library call writes its result converted (nodes: the op, the cast).
  bool converts_result() const { return kind == eager && nodes.size() == 2; }
  // The node whose values an eager or view step yields: the cast when it converts.
  int32_t result_node() const { return nodes.back(); }
};

// "pointwise", "reduction", "eager", "view".
const char* kind_name(ScheduleStep::Kind kind);

// The schedule described above.
std::vector<ScheduleStep> fuse(const Graph& graph);

// The steps of a schedule whose only work is a dtype conversion: every node a convert op
// (OpDef::elementwise, cast and clone), at least one changing the dtype. Mixed precision
// wants none but the casts of values that nothing in the graph computes (parameters and
// inputs cast for a GEMM or convolution: a kernel per cast is the least they cost);
// `of_computed` counts the others, which could have fused into their producer or consumer.
// kiln-ir reports these counts; tests hold them.
struct CastSteps {
  std::vector<size_t> of_inputs;    // indices into the schedule: casts of graph inputs (through views)
  std::vector<size_t> of_computed;  // casts of values some step computes
  size_t total() const { return of_inputs.size() + of_computed.size(); }
};
CastSteps stand_alone_casts(const Graph& graph, const std::vector<ScheduleStep>& schedule);

}  // namespace kiln::compiler
