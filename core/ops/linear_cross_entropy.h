#pragma once
// A linear layer and cross entropy as one op: the loss of `input @ weight^T + bias` against
// class indices, the way a language model's head meets its loss. It gives what
// cross_entropy(linear(input, weight, bias), target, {.ignore_index, .reduction}) gives, but
// the logits of a row whose target is ignore_index are never computed: their loss and
// gradients are zero. A masked-LM batch predicts 15% of its tokens, so the vocabulary's
// products (most of a small BERT's step) shrink to that share.
//
// The compiler rewrites the traced chain (matmul, bias add, log_softmax, nll_loss and their
// backward ops) into this op where nothing else reads the logits
// (compiler/passes/linear_cross_entropy.cpp); eager code may call it directly.
//
// Shapes: input [M, H], weight [V, H] (a Linear's layout), bias [V] or undefined, target i64
// [M] in [0, V) or ignore_index. f32 and f64; on the CPU the products run through the CPU
// GEMM (kernels/cpu/gemm.h), the row sums in f64; on CUDA the op is composed of eager ops
// (kernels/linear_cross_entropy_composed.h), which read the target back to find the rows.
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace kiln {

struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  std::string reduction = "mean";  // "mean" (over the counted targets; NaN when none is) or "sum"
};

// The op's outputs. `logits` is a workspace for the backward op: its first `counted` rows
// hold the logits (bias added) of the rows whose target is counted, in row order; the
// rows after them are unspecified.
struct LinearCrossEntropyResult {
  Tensor loss;          // [], the input's dtype
  Tensor correct;       // i64 []: the counted rows whose first maximal logit is the target
  Tensor log_sum_exp;   // f64 [M]: per counted row, log(sum(exp(logits))); 0 for an ignored row
  Tensor logits;        // [M, V], the input's dtype (above)
};

struct LinearCrossEntropyGrads {
  Tensor grad_input;   // [M, H]; zero rows where the target is ignored
  Tensor grad_weight;  // [V, H]
  Tensor grad_bias;    // [V] (computed whether or not a bias was given)
};

// The loss alone, differentiable in input, weight and bias.
Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& bias,
                            const Tensor& target, const LinearCrossEntropyOptions& options = {});
// All four outputs of the op "linear_cross_entropy".
LinearCrossEntropyResult linear_cross_entropy_with_stats(const Tensor& input, const Tensor& weight,
                                                         const Tensor& bias, const Tensor& target,
                                                         const LinearCrossEntropyOptions& options = {});
// The gradients given grad_loss (shaped like the loss) and the forward's log_sum_exp and
// logits (op "linear_cross_entropy_backward").
LinearCrossEntropyGrads linear_cross_entropy_backward(const Tensor& grad_loss, const Tensor& input,
                                                      const Tensor& weight, const Tensor& bias,
                                                      const Tensor& target, const Tensor& log_sum_exp,
                                                      const Tensor& logits,
                                                      const LinearCrossEntropyOptions& options = {});

}  // namespace kiln
