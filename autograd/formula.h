#pragma once
// Backward formulas: one per differentiable op, written with ordinary Tensor ops so that a
// traced backward is ordinary IR. A formula reads what its op saved (inputs, outputs,
// attributes) and the gradients of the op's outputs, and returns one gradient per input.
#include <span>
#include <vector>

#include "core/registry.h"

namespace kiln {

struct BackwardContext {
  const OpDef& op;
  const Attrs& attrs;
  std::span<const Tensor> inputs;   // the forward inputs (undefined unless saved)
  std::span<const Tensor> outputs;  // the forward outputs (undefined unless saved)
  std::span<const TensorMeta> input_metas;  // always there: shapes, dtypes, devices
  std::span<const Tensor> grads;    // one per output; undefined when none flowed
  std::span<const bool> needs_grad;  // per input: whether its gradient is wanted

  const Tensor& input(size_t i) const;   // errors when not saved
  const Tensor& output(size_t i) const;
  const Tensor& grad(size_t i = 0) const { return grads[i]; }
  bool needs(size_t i) const { return i < needs_grad.size() && needs_grad[i]; }
};

struct BackwardFormula {
  using Fn = std::vector<Tensor> (*)(const BackwardContext& ctx);
  Fn fn = nullptr;
  bool saves_inputs = true;
  bool saves_outputs = false;
  // Inputs not saved even when saves_inputs is set: ones the formula never reads and that
  // may legitimately change before backward (batch norm's running statistics).
  std::vector<int> unsaved_inputs = {};
};

// Attaches `formula` to `op` (from a static initializer in autograd/formulas/).
void register_backward(std::string_view op, BackwardFormula formula);

// The gradient `grad` of a broadcast result, summed back to `shape` (the input's shape
// before broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace kiln
