#pragma once
// Lowering of fusion groups of the graph IR to the kernel IR (kernel_ir.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_ir.h"
#include "compiler/ir/graph.h"

namespace kiln::compiler::codegen {

// What the code generator computes, from the facts of the op's registry entry: an
// elementwise op inside a pointwise kernel (OpDef::elementwise, all but none and opaque),
// and a reduction (OpDef::reduction sum, mean, amax, amin) at the end of a reduction kernel.
bool lowers_pointwise(const OpDef& op);
bool lowers_reduction(const OpDef& op);

// One kernel computing a group of elementwise op nodes (indices into g.nodes()) over one
// iteration space: the shape of the group's values used outside it (by other nodes, the
// graph's outputs or write-backs), which become the kernel's outputs, in node order; they
// must all have that shape. Other values stay in registers. Operands from outside the group
// are input buffers: a graph input or another node's value, seen through the view nodes
// (permute, expand, view, slice, ...) between it and the group, whose strides and offset
// become arguments; constants are inlined. Ops broadcast as NumPy does (no index term).
// Ops lowers_pointwise refuses (and view nodes inside the group) are a kiln::Error naming
// the op.
Kernel lower_pointwise(const Graph& g, const std::vector<int32_t>& nodes);

// One kernel for a reduction node (sum, mean, amax, amin) over a pointwise prologue: `nodes`
// holds the reduction and elementwise nodes feeding it whose values are used only inside the
// group, and side outputs: elementwise nodes of the reduction's input space that do not
// read its result (before or after it in graph order), stored element by element as the
// inner loops walk them (a cast of the reduced input for a later GEMM). The reduced dims
// become the inner loops; sums of floating values accumulate in f64 (as the eager kernels
// do), of integers and bools in i64.
Kernel lower_reduction(const Graph& g, const std::vector<int32_t>& nodes);
// The same, or nothing when the group is not one reduction kernel (it holds no reduction the
// generator supports, a value used outside the group is not a side output, it reduces
// nothing, or no input walks a reduced dim); `refusal` says which. Fusion asks this.
std::optional<Kernel> try_lower_reduction(const Graph& g, const std::vector<int32_t>& nodes, std::string& refusal);

}  // namespace kiln::compiler::codegen
