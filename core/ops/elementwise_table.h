#pragma once
// The elementwise ops whose element is one function of kernels/scalar.h, named as the op:
// X(name, category, arity, bools, cast_policy), with
//   category     how the op computes (Elementwise in core/registry.h): same, floating,
//                compare or logical;
//   arity        its number of tensor operands;
//   bools        any, or no_bool where bool tensors are an error (neg, relu);
//   cast_policy  what autocast does to its inputs (CastPolicy in core/registry.h).
// core/ops/elementwise.cpp defines the ops from this table and kernels/cpu/elementwise.cpp
// registers their CPU kernels from it; the code generator and the CUDA kernels read the
// facts from the registry. A new such op is one line here and its function in
// kernels/scalar.h (docs/adding-an-op.md). The elementwise ops with rules of their own
// (add and sub with alpha, where, clamp, cast, clone, fill, gelu, gelu_backward, softplus,
// to_device) are defined one by one in core/ops/elementwise.cpp.
#define KILN_SCALAR_OPS(X)                              \
  X(neg, same, 1, no_bool, none)                        \
  X(abs, same, 1, any, none)                            \
  X(sign, same, 1, any, none)                           \
  X(relu, same, 1, no_bool, none)                       \
  X(exp, floating, 1, any, f32)                         \
  X(log, floating, 1, any, f32)                         \
  X(log1p, floating, 1, any, f32)                       \
  X(expm1, floating, 1, any, f32)                       \
  X(sqrt, floating, 1, any, none)                       \
  X(rsqrt, floating, 1, any, f32)                       \
  X(reciprocal, floating, 1, any, f32)                  \
  X(sin, floating, 1, any, none)                        \
  X(cos, floating, 1, any, none)                        \
  X(tanh, floating, 1, any, none)                       \
  X(sigmoid, floating, 1, any, none)                    \
  X(silu, floating, 1, any, none)                       \
  X(logical_not, logical, 1, any, none)                 \
  X(mul, same, 2, any, promote)                         \
  X(div, floating, 2, any, promote)                     \
  X(pow, same, 2, any, f32)                             \
  X(maximum, same, 2, any, promote)                     \
  X(minimum, same, 2, any, promote)                     \
  X(eq, compare, 2, any, promote)                       \
  X(ne, compare, 2, any, promote)                       \
  X(lt, compare, 2, any, promote)                       \
  X(le, compare, 2, any, promote)                       \
  X(gt, compare, 2, any, promote)                       \
  X(ge, compare, 2, any, promote)                       \
  X(logical_and, logical, 2, any, none)                 \
  X(logical_or, logical, 2, any, none)
