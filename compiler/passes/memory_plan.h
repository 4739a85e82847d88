#pragma once
// The memory plan (../../shared/COMPILER.md, "Memory"): where each value of a fused schedule
// (compiler/fusion.h) lives while the schedule runs, computed once from the graph and its
// steps, before any tensor exists. Program (compiler/program.h) runs by it.
//
//   const std::vector<ScheduleStep> steps = fuse(graph);
//   const MemoryPlan plan = plan_memory(graph, steps);
//
// Four rules, each a function of the ones before:
// - releases: per step, the values (per output, not per node) that no later step, output
//   or write-back reads, dropped after it so that their memory goes back to the allocator;
// - in place: a value written back into graph input I is computed straight into I's tensor
//   when no later step reads I's old value (and the step itself reads it only at the
//   element it writes), so the write-back copies nothing; an eager op whose outputs are all
//   such write-backs runs as its in-place twin (sgd_update -> sgd_update_);
// - reuse: a pointwise kernel's output takes the memory of an input value of its type that
//   dies at that step and is read only at the element the output writes (a relu backward
//   writing its gradient over the incoming one);
// - peak: the most bytes of values the schedule makes alive at once under those rules.
// A plan says what may be done; the runner still checks at run time that a tensor can be
// written (no other handle, view or input shares it) and allocates where it cannot.
#include <cstdint>
#include <vector>

#include "compiler/fusion.h"
#include "compiler/ir/graph.h"
#include "core/registry.h"

namespace kiln::compiler {

struct MemoryPlan {
  // Per step: the op values released after it (graph inputs, constants, outputs and
  // written-back values are never released).
  std::vector<std::vector<Value>> release_after;
  // Per step: for a kernel step, per output buffer (in output_buffers() order), the index
  // in graph.inputs() of the input the output is computed into (-1: a fresh tensor); empty
  // for other steps.
  std::vector<std::vector<int32_t>> in_place_outputs;
  // Per step: for an eager step whose outputs are all write-backs of the inputs its op
  // would update, the in-place twin to run instead; null otherwise.
  std::vector<const OpDef*> in_place_op;
  // Per step: for an eager step of one output written back to an input the step does not
  // read (or reads only at the element it writes: an accumulator input, as addmm's bias),
  // that input's index in graph.inputs(), which the op writes its result into; -1 otherwise.
  std::vector<int32_t> in_place_eager;
  // Per step: for a pointwise kernel step, per output buffer, the position among the
  // kernel's input buffers (input_buffers() order) of the dying value whose memory the
  // output takes (-1: none); empty for other steps.
  std::vector<std::vector<int32_t>> reuse_input;
  // The most bytes of values made by the schedule alive at once (graph inputs, constants
  // and library ops' scratch not counted; views cost nothing; outputs live to the end).
  int64_t peak_bytes = 0;
};

// The plan of running `steps` (fuse(graph)) in order.
MemoryPlan plan_memory(const Graph& graph, const std::vector<ScheduleStep>& steps);

}  // namespace kiln::compiler
