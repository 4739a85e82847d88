#pragma once
// The kernel IR: what one generated kernel does (../../shared/COMPILER.md, "Two IRs").
//
// A kernel runs over an N-d iteration space whose sizes are runtime arguments. Each buffer
// is indexed by  offset + sum_d i_d * stride_d  where the strides and the offset are
// arguments too; a dimension in which a buffer broadcasts (it lacks the dimension or has
// size 1 where the space does not) has no term at all. So the rendered source depends only
// on the kernel's structure (ops, dtypes, rank, which buffers broadcast where), never on
// sizes or strides, and one compiled function serves every call of that structure.
//
// The body is an expression DAG in topological order: loads, constants, casts and scalar
// ops named as the functions of kernels/scalar.h; stores write expressions to the output
// buffers. A reduction kernel puts its reduced dimensions last: the kept dimensions are the
// outer loops, `reduce` expressions accumulate (from their identity, with their combine op)
// over the inner ones, and whatever depends on a reduce is evaluated after the inner loops.
// A reduction kernel may also store values of its whole space (an output that walks the
// reduced dims too: a cast of the reduced input that fusion stored beside the sum); those
// stores happen inside the inner loops, once per element.
//
// Text form (print):
//
//   kernel mul_add_relu(out0: f32, in0: f32, in1: f32 bcast[0]) sizes[2] {
//     for i0, i1 {
//       v0 = in0[i0*s0 + i1*s1 + off]
//       v1 = 2 : f32
//       v2 = mul(v0, v1) : f32
//       ...
//       out0[i0*s0 + i1*s1 + off] = v5
//     }
//   }
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"

namespace kiln::compiler::codegen {

enum class ExprKind : uint8_t {
  load,          // buffer[index]: `buffer`
  constant,      // `value` as `dtype`
  cast,          // args[0] converted to `dtype` (to bool: != 0)
  op,            // kiln::scalar::<op>(args...)
  reduce,        // accumulates args[0] over the reduced dims: acc = <op>(acc, x) from `value`
  reduce_count,  // the number of elements reduced over (a product of sizes), as `dtype`
};

struct Expr {
  ExprKind kind = ExprKind::op;
  // The value's dtype. Registers hold f16 and bf16 values as float (kernels/scalar.h computes
  // them in f32), rounded to the 16-bit type after each op as the eager kernels do.
  DType dtype = DType::f32;
  std::string op;             // op, reduce: the kernels/scalar.h function
  std::vector<int32_t> args;  // operands: indices of earlier exprs
  int32_t buffer = -1;        // load
  Scalar value;               // constant; reduce: the identity
};

// A view op applied to an input buffer's tensor before indexing it (permute, expand, ...).
struct ViewStep {
  const OpDef* op = nullptr;
  Attrs attrs;
};

struct Buffer {
  std::string name;  // "out0", "in1": outputs first, then inputs
  DType dtype = DType::f32;
  bool output = false;
  // Per iteration dim: the dim of the (viewed) tensor it walks, or -1 where the buffer
  // broadcasts (no index term). Outputs of reductions broadcast over the reduced dims.
  std::vector<int32_t> dim_of;
  // Inputs: the tensor given at run time is viewed through these steps first; their strides
  // and offset become arguments. Empty for outputs.
  std::vector<ViewStep> views;
  // Where the buffer comes from in the graph it was lowered from (for the runtime that binds
  // it): inputs, the value read before the views; outputs, the group value stored.
  int32_t node = -1;
  int32_t output_index = 0;

  bool broadcasts(int32_t dim) const { return dim_of[static_cast<size_t>(dim)] < 0; }
};

struct Store {
  int32_t buffer = -1;
  int32_t expr = -1;
};

struct Kernel {
  std::string name;  // from the ops ("mul_add_relu"); structural, so stable between groups
  int32_t rank = 0;  // iteration dims; their sizes are arguments
  int32_t num_reduced = 0;  // the last num_reduced iteration dims are reduced
  // Per iteration dim: the (buffer, dim) whose size gives it at run time.
  std::vector<std::pair<int32_t, int32_t>> size_from;
  std::vector<Buffer> buffers;
  std::vector<Expr> exprs;  // topological order
  std::vector<Store> stores;
  Shape shape;  // the iteration sizes of the graph it was lowered from (dumps only)

  int32_t num_outputs() const;
  int32_t num_inputs() const;
  // Indices into `buffers` of the outputs, and of the inputs, in order.
  std::vector<int32_t> output_buffers() const;
  std::vector<int32_t> input_buffers() const;
};

// The layout of the int64 argument array the generated function reads: the iteration sizes
// (args[0..rank)), then per buffer its strides for the dims it does not broadcast (in dim
// order) followed by its offset, all in elements.
struct ArgLayout {
  std::vector<int32_t> stride_base;  // per buffer: the index of its first stride
  std::vector<int32_t> offset;       // per buffer: the index of its offset
  int32_t count = 0;
};
ArgLayout arg_layout(const Kernel& kernel);

// Whether expr `e` is evaluated after the reduction loops (it depends on a reduce).
std::vector<bool> after_reduction(const Kernel& kernel);
// Per store: whether it is written inside a reduction's inner loops (its buffer walks a
// reduced dim), not once per kept index after them.
std::vector<bool> inner_stores(const Kernel& kernel);

// The text form above.
std::string print(const Kernel& kernel);
// The text of a constant of `dtype` in dumps ("2", "-inf", "true").
std::string constant_text(const Scalar& value, DType dtype);

}  // namespace kiln::compiler::codegen
