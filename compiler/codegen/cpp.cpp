#include "compiler/codegen/cpp.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace kiln::compiler::codegen {
namespace {

// Spaces smaller than this run on one thread: starting the team costs more than it saves.
constexpr int64_t kParallelThreshold = 32768;

std::string storage_type(DType d) {
  switch (d) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "kiln::Half";
    case DType::bf16: return "kiln::BFloat16";
    case DType::i64: return "int64_t";
    case DType::i32: return "int32_t";
    case DType::u8: return "uint8_t";
    case DType::boolean: return "bool";
  }
  fail("render_cpp: invalid dtype {}", static_cast<int>(d));
}

// Registers hold the 16-bit floats as float (kernels/scalar.h computes them in f32).
std::string register_type(DType d) { return is_reduced_float(d) ? "float" : storage_type(d); }

std::string double_literal(double v) {
  if (std::isnan(v)) return "__builtin_nan(\"\")";
  if (std::isinf(v)) return v > 0 ? "__builtin_inf()" : "(-__builtin_inf())";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string literal(const Scalar& value, DType d) {
  if (d == DType::boolean) return value.to<bool>() ? "true" : "false";
  if (is_floating(d)) {
    const std::string s = double_literal(value.to_double());
    return d == DType::f64 ? s : "float(" + s + ")";
  }
  const int64_t v = value.kind() == DType::f64 ? static_cast<int64_t>(value.to_double()) : value.to_int();
  const std::string s = v == std::numeric_limits<int64_t>::min() ? "(-9223372036854775807LL - 1)"
                                                                 : fmt::format("{}LL", v);
  return d == DType::i64 ? "int64_t(" + s + ")" : fmt::format("static_cast<{}>({})", storage_type(d), s);
}

// `x` (a register of dtype d) rounded to d when d is a 16-bit float, as the eager kernels
// store every op's result.
std::string rounded(const std::string& x, DType d) {
  return is_reduced_float(d) ? fmt::format("float({}({}))", storage_type(d), x) : x;
}

class Renderer {
 public:
  explicit Renderer(const Kernel& k) : k_(k), after_(after_reduction(k)) {}

  std::string render() {
    out_ += fmt::format("// kiln kernel {}: generated from the kernel IR; depends on structure only.\n",
                        k_.name);
    out_ += "#include <cstdint>\n#include \"core/half.h\"\n#include \"kernels/scalar.h\"\n\n";
    out_ += fmt::format("extern \"C\" void {}(void* const* buffers, const int64_t* args) {{\n",
                        cpp_symbol(k_));
    const ArgLayout layout = arg_layout(k_);
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      const std::string t = storage_type(buf.dtype);
      if (buf.output)
        line(1, fmt::format("{}* const {} = static_cast<{}*>(buffers[{}]);", t, buf.name, t, b));
      else
        line(1, fmt::format("const {}* const {} = static_cast<const {}*>(buffers[{}]);", t, buf.name, t, b));
    }
    for (int32_t d = 0; d < k_.rank; ++d) line(1, fmt::format("const int64_t n{} = args[{}];", d, d));
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      int32_t next = layout.stride_base[b];
      for (int32_t d = 0; d < k_.rank; ++d)
        if (!buf.broadcasts(d)) line(1, fmt::format("const int64_t {}_s{} = args[{}];", buf.name, d, next++));
      line(1, fmt::format("const int64_t {}_off = args[{}];", buf.name, layout.offset[b]));
    }
    if (k_.num_reduced == 0 && k_.rank > 0) {
      std::vector<std::string> unit;
      for (const Buffer& buf : k_.buffers)
        if (!buf.broadcasts(k_.rank - 1)) unit.push_back(fmt::format("{}_s{} == 1", buf.name, k_.rank - 1));
      line(1, fmt::format("if ({}) {{", fmt::join(unit, " && ")));
      pointwise_nest(2, true);
      line(1, "} else {");
      pointwise_nest(2, false);
      line(1, "}");
    } else if (k_.num_reduced == 0) {
      body(1, false);
      stores(1, false);
    } else {
      reduction_nest();
    }
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  void line(int depth, const std::string& text) { out_ += std::string(2 * static_cast<size_t>(depth), ' ') + text + "\n"; }

  std::string product(int32_t begin, int32_t end) const {
    std::vector<std::string> n;
    for (int32_t d = begin; d < end; ++d) n.push_back(fmt::format("n{}", d));
    return n.empty() ? "1" : fmt::format("{}", fmt::join(n, " * "));
  }

  void omp(int depth, int32_t loops) {
    if (loops <= 0) return;
    const std::string collapse = loops > 1 ? fmt::format(" collapse({})", loops) : "";
    line(depth, fmt::format("#pragma omp parallel for{} schedule(static) if ({} > {})", collapse,
                            product(0, k_.rank), kParallelThreshold));
  }

  void open_loops(int& depth, int32_t begin, int32_t end) {
    for (int32_t d = begin; d < end; ++d)
      line(depth++, fmt::format("for (int64_t i{} = 0; i{} < n{}; ++i{}) {{", d, d, d, d));
  }
  void close_loops(int& depth, int32_t count) {
    for (int32_t i = 0; i < count; ++i) line(--depth, "}");
  }

  std::string index(const Buffer& buf, bool unit) const {
    std::string text = buf.name + "_off";
    for (int32_t d = 0; d < k_.rank; ++d) {
      if (buf.broadcasts(d)) continue;
      if (unit && d == k_.rank - 1) text += fmt::format(" + i{}", d);
      else text += fmt::format(" + i{} * {}_s{}", d, buf.name, d);
    }
    return fmt::format("{}[{}]", buf.name, text);
  }

  std::string expr_code(size_t e, bool unit) const {
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
        return rounded(fmt::format("static_cast<{}>({})", register_type(x.dtype), args[0]), x.dtype);
      case ExprKind::op:
        return rounded(fmt::format("kiln::scalar::{}({})", x.op, fmt::join(args, ", ")), x.dtype);
      case ExprKind::reduce: return fmt::format("acc{}", e);
      case ExprKind::reduce_count:
        return fmt::format("static_cast<{}>({})", register_type(x.dtype), product(k_.rank - k_.num_reduced, k_.rank));
    }
    return "";
  }

  // The exprs evaluated in the innermost loop (after_reduction false) or after it (true).
  void body(int depth, bool after, bool unit = false) {
    for (size_t e = 0; e < k_.exprs.size(); ++e) {
      if (after_[e] != after) continue;
      const Expr& x = k_.exprs[e];
      line(depth, fmt::format("const {} v{} = {};", register_type(x.dtype), e, expr_code(e, unit)));
    }
  }

  void stores(int depth, bool unit) {
    for (const Store& s : k_.stores) {
      const Buffer& buf = k_.buffers[static_cast<size_t>(s.buffer)];
      line(depth, fmt::format("{} = {}(v{});", index(buf, unit), storage_type(buf.dtype), s.expr));
    }
  }

  void pointwise_nest(int depth, bool unit) {
    omp(depth, k_.rank == 1 ? 1 : k_.rank - 1);
    open_loops(depth, 0, k_.rank);
    body(depth, false, unit);
    stores(depth, unit);
    close_loops(depth, k_.rank);
  }

  void reduction_nest() {
    const int32_t kept = k_.rank - k_.num_reduced;
    int depth = 1;
    omp(depth, kept);
    open_loops(depth, 0, kept);
    for (size_t e = 0; e < k_.exprs.size(); ++e) {
      const Expr& x = k_.exprs[e];
      if (x.kind == ExprKind::reduce)
        line(depth, fmt::format("{} acc{} = {};", register_type(x.dtype), e, literal(x.value, x.dtype)));
    }
    open_loops(depth, kept, k_.rank);
    body(depth, false);
    for (size_t e = 0; e < k_.exprs.size(); ++e) {
      const Expr& x = k_.exprs[e];
      if (x.kind == ExprKind::reduce)
        line(depth, fmt::format("acc{} = kiln::scalar::{}(acc{}, v{});", e, x.op, e, x.args[0]));
    }
    close_loops(depth, k_.num_reduced);
    body(depth, true);
    stores(depth, false);
    close_loops(depth, kept);
  }

  const Kernel& k_;
  std::vector<bool> after_;
  std::string out_;
};

}  // namespace

std::string cpp_symbol(const Kernel& kernel) { return "k_" + kernel.name; }

std::string render_cpp(const Kernel& kernel) { return Renderer(kernel).render(); }

}  // namespace kiln::compiler::codegen
