#include "compiler/codegen/render.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace kiln::compiler::codegen {

const TargetSyntax kCppSyntax = {
    .who = "render_cpp",
    .storage = {"float", "double", "kiln::Half", "kiln::BFloat16", "int64_t", "int32_t", "uint8_t", "bool"},
    .index_type = "int64_t",
    .i64_literal = "int64_t({})",
    .nan = "__builtin_nan(\"\")",
    .inf = "__builtin_inf()",
};

// NVRTC has no <cstdint> and no __builtin_nan: plain C types and bit patterns.
const TargetSyntax kCudaSyntax = {
    .who = "render_cuda",
    .storage = {"float", "double", "kiln::Half", "kiln::BFloat16", "long long", "int", "unsigned char", "bool"},
    .index_type = "long long",
    .i64_literal = "{}",
    .nan = "__longlong_as_double(0x7ff8000000000000LL)",
    .inf = "__longlong_as_double(0x7ff0000000000000LL)",
};

KernelRenderer::KernelRenderer(const Kernel& kernel, const TargetSyntax& syntax)
    : k_(kernel), syntax_(syntax), after_(after_reduction(kernel)), inner_(inner_stores(kernel)) {}

std::string KernelRenderer::storage_type(DType d) const {
  const auto i = static_cast<size_t>(d);
  if (i >= static_cast<size_t>(kNumDTypes)) fail("{}: invalid dtype {}", syntax_.who, i);
  return syntax_.storage[i];
}

std::string KernelRenderer::register_type(DType d) const {
  return is_reduced_float(d) ? "float" : storage_type(d);
}

std::string KernelRenderer::literal(const Scalar& value, DType d) const {
  if (d == DType::boolean) return value.to<bool>() ? "true" : "false";
  if (is_floating(d)) {
    const double v = value.to_double();
    std::string s;
    if (std::isnan(v)) {
      s = syntax_.nan;
    } else if (std::isinf(v)) {
      s = v > 0 ? std::string(syntax_.inf) : fmt::format("(-{})", syntax_.inf);
    } else {
      s = fmt::format("{}", v);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
    }
    return d == DType::f64 ? s : "float(" + s + ")";
  }
  const int64_t v = value.kind() == DType::f64 ? static_cast<int64_t>(value.to_double()) : value.to_int();
  const std::string s = v == std::numeric_limits<int64_t>::min() ? "(-9223372036854775807LL - 1)"
                                                                 : fmt::format("{}LL", v);
  return d == DType::i64 ? fmt::format(fmt::runtime(syntax_.i64_literal), s)
                         : fmt::format("static_cast<{}>({})", storage_type(d), s);
}

std::string KernelRenderer::rounded(const std::string& x, DType d) const {
  return is_reduced_float(d) ? fmt::format("float({}({}))", storage_type(d), x) : x;
}

std::string KernelRenderer::convert(const std::string& type, const std::string& x) {
  return type.find(' ') == std::string::npos ? fmt::format("{}({})", type, x)
                                             : fmt::format("static_cast<{}>({})", type, x);
}

void KernelRenderer::line(int depth, const std::string& text) {
  out_ += std::string(2 * static_cast<size_t>(depth), ' ') + text + "\n";
}

std::string KernelRenderer::product(int32_t begin, int32_t end) const {
  std::vector<std::string> n;
  for (int32_t d = begin; d < end; ++d) n.push_back(fmt::format("n{}", d));
  return n.empty() ? "1" : fmt::format("{}", fmt::join(n, " * "));
}

void KernelRenderer::declare_arguments(int depth, const char* element) {
  const ArgLayout layout = arg_layout(k_);
  const std::string t = syntax_.index_type;
  auto arg = [&](int32_t i) { return fmt::format(fmt::runtime(element), i); };
  for (int32_t d = 0; d < k_.rank; ++d) line(depth, fmt::format("const {} n{} = {};", t, d, arg(d)));
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    const Buffer& buf = k_.buffers[b];
    int32_t next = layout.stride_base[b];
    for (int32_t d = 0; d < k_.rank; ++d)
      if (!buf.broadcasts(d)) line(depth, fmt::format("const {} {}_s{} = {};", t, buf.name, d, arg(next++)));
    line(depth, fmt::format("const {} {}_off = {};", t, buf.name, arg(layout.offset[b])));
  }
}

std::string KernelRenderer::offset(const Buffer& buf, bool unit) const {
  std::string text = buf.name + "_off";
  for (int32_t d = 0; d < k_.rank; ++d) {
    if (buf.broadcasts(d)) continue;
    if ((unit && d == k_.rank - 1) || (!buf.output && d == unit_input_dim_)) text += fmt::format(" + i{}", d);
    else text += fmt::format(" + i{} * {}_s{}", d, buf.name, d);
  }
  return text;
}

std::string KernelRenderer::index(const Buffer& buf, bool unit) const {
  const auto b = static_cast<size_t>(&buf - k_.buffers.data());
  if (lane_ >= 0 && b < vector_buffer_.size() && vector_buffer_[b]) return fmt::format("{}_v.v[{}]", buf.name, lane_);
  return fmt::format("{}[{}]", buf.name, offset(buf, unit));
}

std::string KernelRenderer::expr_code(size_t e, bool unit) const {
  const Expr& x = k_.exprs[e];
  std::vector<std::string> args;
  for (int32_t a : x.args) args.push_back(fmt::format("v{}", a));
  switch (x.kind) {
    case ExprKind::load: {
      const std::string load = index(k_.buffers[static_cast<size_t>(x.buffer)], unit);
      return is_reduced_float(x.dtype) ? fmt::format("float({})", load) : load;
    }
    case ExprKind::constant: return literal(x.value, x.dtype);
    case ExprKind::cast:
      if (x.dtype == DType::boolean) return fmt::format("({} != 0)", args[0]);
      // Floating to u8 or i32 goes through i64: defined for negative and large values (a
      // direct conversion is undefined there; CUDA saturates, x86 wraps), and it wraps as
      // the CPU kernels do on x86.
      if ((x.dtype == DType::u8 || x.dtype == DType::i32) && is_floating(k_.exprs[static_cast<size_t>(x.args[0])].dtype))
        return fmt::format("static_cast<{}>(static_cast<long long>({}))", register_type(x.dtype), args[0]);
      return rounded(fmt::format("static_cast<{}>({})", register_type(x.dtype), args[0]), x.dtype);
    case ExprKind::op:
      return rounded(fmt::format("kiln::scalar::{}({})", x.op, fmt::join(args, ", ")), x.dtype);
    case ExprKind::reduce: return fmt::format("acc{}", e);
    case ExprKind::reduce_count:
      return fmt::format("static_cast<{}>({})", register_type(x.dtype), product(k_.rank - k_.num_reduced, k_.rank));
  }
  return "";
}

void KernelRenderer::body(int depth, bool after, bool unit) {
  for (size_t e = 0; e < k_.exprs.size(); ++e) {
    if (after_[e] != after) continue;
    const Expr& x = k_.exprs[e];
    line(depth, fmt::format("const {} v{} = {};", register_type(x.dtype), e, expr_code(e, unit)));
  }
}

void KernelRenderer::stores(int depth, bool unit, bool inner) {
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    if (inner_[i] != inner) continue;
    const Store& s = k_.stores[i];
    const Buffer& buf = k_.buffers[static_cast<size_t>(s.buffer)];
    line(depth, fmt::format("{} = {};", index(buf, unit), convert(storage_type(buf.dtype), fmt::format("v{}", s.expr))));
  }
}

void KernelRenderer::combine_reductions(int depth, const std::string& x, const std::string& acc) {
  for (size_t e = 0; e < k_.exprs.size(); ++e) {
    const Expr& r = k_.exprs[e];
    if (r.kind != ExprKind::reduce) continue;
    const std::string operand = fmt::format(fmt::runtime(x), e, r.args[0]);
    const std::string into = fmt::format(fmt::runtime(acc), e);
    line(depth, fmt::format("{} = kiln::scalar::{}({}, {});", into, r.op, into, operand));
  }
}

void KernelRenderer::declare_accumulators(int depth, const std::string& prefix) {
  for (size_t e = 0; e < k_.exprs.size(); ++e) {
    const Expr& x = k_.exprs[e];
    if (x.kind == ExprKind::reduce)
      line(depth, fmt::format("{}{} acc{} = {};", prefix, register_type(x.dtype), e, literal(x.value, x.dtype)));
  }
}

}  // namespace kiln::compiler::codegen
