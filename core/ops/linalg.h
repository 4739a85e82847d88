#pragma once
// Matrix products. Operands share one dtype and device; f32 and f64 go through the CPU
// GEMM, f16 and bf16 are multiplied in f32 and rounded once, integers are exact (wrapping
// on overflow). Bool operands are an error.
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

}  // namespace kiln
