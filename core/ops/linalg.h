#pragma once
// Matrix products. Operands share one dtype and device; f32 and f64 go through the CPU
// GEMM, f16 and bf16 are multiplied in f32 and rounded once, integers are exact (wrapping
// on overflow). Bool operands are an error.
#include <string>

#include "core/tensor.h"

namespace kiln {

// torch.matmul: 1-d @ 1-d is a dot product (0-d result); a 1-d left operand is a row and a
// 1-d right operand a column (that dim is dropped from the result); operands of 3 or more
// dims are stacks of matrices whose batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// The product of two 2-d tensors.
Tensor mm(const Tensor& a, const Tensor& b);
// The products of two stacks [B,m,k] @ [B,k,n] of equal batch size (no broadcasting).
Tensor bmm(const Tensor& a, const Tensor& b);
// beta * bias + alpha * (a @ b) for 2-d a and b, bias broadcast to the result; with
// beta == 0 the bias is not read (NaNs in it do not propagate).
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, Scalar beta = 1,
             Scalar alpha = 1);

// A Linear's product, bias and activation as one op, the way cuBLASLt's epilogues compute
// them on CUDA (RELU_BIAS, GELU_AUX_BIAS): out = act(a @ b + bias) for 2-d a [M, K] and b
// [K, N] and a bias [N], all of one floating dtype and device. activation "relu" gives `out`
// alone (relu's backward reads its output); "gelu_tanh" (gelu with approximate "tanh", the
// only GELU cuBLASLt has) also gives `pre` = a @ b + bias, which gelu's backward reads.
// The compiler makes these from the traced chain on CUDA (compiler/passes/passes.h,
// gemm_activations); they are not differentiable. On the CPU, and on CUDA where cuBLASLt
// offers no algorithm, they are the chain's ops (addmm, then the activation).
struct AddmmActivation {
  Tensor out;
  Tensor pre;  // undefined for "relu"
};
AddmmActivation addmm_activation(const Tensor& bias, const Tensor& a, const Tensor& b, const std::string& activation);

// The backward of a tanh GELU through the product that brings its gradient, as cuBLASLt's
// DGELU_BGRAD epilogue computes it: grad_pre = gelu_backward(g @ w, pre, "tanh") for 2-d g
// [M, K] and w [K, N] and pre [M, N] (the GELU's input), and grad_bias = grad_pre summed over
// its rows, [N] (the gradient of the bias that made pre). Not differentiable.
struct MmGeluBackward {
  Tensor grad_pre;
  Tensor grad_bias;
};
MmGeluBackward mm_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre);

}  // namespace kiln
