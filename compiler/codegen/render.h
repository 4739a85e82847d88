#pragma once
// What the C++ and CUDA renderers share (cpp.cpp, cuda.cpp): the expression code over
// kernels/scalar.h, buffer index expressions, constants, the 16-bit float rounding points
// and the argument declarations. A target differs only in the small table below and in its
// loop structure, so both targets compute the same values by the same scalar functions
// with the same roundings.
#include <string>

#include "compiler/codegen/kernel_ir.h"

namespace kiln::compiler::codegen {

// The spelling of types and special values in a target's source.
struct TargetSyntax {
  const char* who;                       // names the renderer in errors ("render_cpp")
  const char* storage[kNumDTypes];       // per DType, in the enum's order
  const char* index_type;                // 64-bit signed integer: sizes, strides, indices
  const char* i64_literal;               // wraps an i64 literal, "{}" the digits ("int64_t({})")
  const char* nan;                       // a double NaN
  const char* inf;                       // a double +infinity
};
extern const TargetSyntax kCppSyntax;
extern const TargetSyntax kCudaSyntax;

class KernelRenderer {
 protected:
  KernelRenderer(const Kernel& kernel, const TargetSyntax& syntax);

  std::string storage_type(DType d) const;
  // Registers hold the 16-bit floats as float (kernels/scalar.h computes them in f32).
  std::string register_type(DType d) const;
  std::string literal(const Scalar& value, DType d) const;
  // `x` (a register of dtype d) rounded to d when d is a 16-bit float, as the eager
  // kernels store every op's result.
  std::string rounded(const std::string& x, DType d) const;

  // `x` converted to `type` ("float(x)"; static_cast for a type of two words).
  static std::string convert(const std::string& type, const std::string& x);
  void line(int depth, const std::string& text);
  // "n<begin> * ... * n<end-1>" ("1" when empty).
  std::string product(int32_t begin, int32_t end) const;
  // Declares n<d>, <buffer>_s<d> and <buffer>_off from the argument array, each element
  // read as fmt::format(element, index) ("args[{}]").
  void declare_arguments(int depth, const char* element);
  // buffer[<off> + i<d> * <buffer>_s<d> ...]; `unit`: the innermost stride is 1. While a
  // vector lane is rendered (lane_ >= 0), a vector buffer's element is <buffer>_v.v[lane_].
  std::string index(const Buffer& buf, bool unit) const;
  // The element offset inside index()'s brackets.
  std::string offset(const Buffer& buf, bool unit) const;
  // The value of expr `e`; a reduce reads its accumulator acc<e>.
  std::string expr_code(size_t e, bool unit) const;
  // `const T v<e> = ...;` for the exprs evaluated before the reduction's end (after ==
  // false: every expr of a pointwise kernel) or after it.
  void body(int depth, bool after, bool unit = false);
  // The stores of inner_stores' kind `inner` (every store of a pointwise kernel is outer).
  void stores(int depth, bool unit, bool inner = false);
  // `acc<e> = <op>(acc<e>, <x>);` for every reduce, combining in `x` (fmt::format(x, e)); `acc`
  // names the accumulator (fmt::format(acc, e)).
  void combine_reductions(int depth, const std::string& x, const std::string& acc = "acc{0}");
  // `T acc<e> = <identity>;` for every reduce.
  void declare_accumulators(int depth, const std::string& prefix = "");

  const Kernel& k_;
  const TargetSyntax& syntax_;
  std::vector<bool> after_;
  std::vector<bool> inner_;  // inner_stores(k_)
  // A dim every input buffer walks with stride 1 in the code being written (checked at run
  // time by its branch), or -1: its index terms drop the stride, so the loop vectorizes.
  int32_t unit_input_dim_ = -1;
  // The lane of a vector of consecutive elements along the innermost dim being written, or
  // -1; vector_buffer_[b]: buffer b is read or written as such vectors (<name>_v) there.
  int lane_ = -1;
  std::vector<bool> vector_buffer_;
  std::string out_;
};

}  // namespace kiln::compiler::codegen
