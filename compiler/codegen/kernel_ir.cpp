#include "compiler/codegen/kernel_ir.h"

#include <cmath>

#include <fmt/format.h>

namespace kiln::compiler::codegen {

int32_t Kernel::num_outputs() const { return static_cast<int32_t>(output_buffers().size()); }
int32_t Kernel::num_inputs() const { return static_cast<int32_t>(input_buffers().size()); }

std::vector<int32_t> Kernel::output_buffers() const {
  std::vector<int32_t> out;
  for (size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b].output) out.push_back(static_cast<int32_t>(b));
  return out;
}

std::vector<int32_t> Kernel::input_buffers() const {
  std::vector<int32_t> in;
  for (size_t b = 0; b < buffers.size(); ++b)
    if (!buffers[b].output) in.push_back(static_cast<int32_t>(b));
  return in;
}

ArgLayout arg_layout(const Kernel& kernel) {
  ArgLayout layout;
  int32_t next = kernel.rank;
  for (const Buffer& buffer : kernel.buffers) {
    layout.stride_base.push_back(next);
    for (int32_t d = 0; d < kernel.rank; ++d)
      if (!buffer.broadcasts(d)) ++next;
    layout.offset.push_back(next++);
  }
  layout.count = next;
  return layout;
}

std::vector<bool> after_reduction(const Kernel& kernel) {
  std::vector<bool> after(kernel.exprs.size(), false);
  for (size_t e = 0; e < kernel.exprs.size(); ++e) {
    const Expr& expr = kernel.exprs[e];
    if (expr.kind == ExprKind::reduce || expr.kind == ExprKind::reduce_count) {
      after[e] = true;
      continue;
    }
    for (int32_t a : expr.args)
      if (after[static_cast<size_t>(a)]) after[e] = true;
  }
  return after;
}

std::vector<bool> inner_stores(const Kernel& kernel) {
  std::vector<bool> inner;
  for (const Store& s : kernel.stores) {
    const Buffer& b = kernel.buffers[static_cast<size_t>(s.buffer)];
    bool walks_reduced = false;
    for (int32_t d = kernel.rank - kernel.num_reduced; d < kernel.rank; ++d) walks_reduced |= !b.broadcasts(d);
    inner.push_back(walks_reduced);
  }
  return inner;
}

std::string constant_text(const Scalar& value, DType dtype) {
  if (dtype == DType::boolean) return value.to<bool>() ? "true" : "false";
  if (is_floating(dtype)) {
    const double v = value.to_double();
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return fmt::format("{}", v);
  }
  return fmt::format("{}", value.kind() == DType::f64 ? static_cast<int64_t>(value.to_double())
                                                      : value.to_int());
}

namespace {

std::string index_text(const Buffer& buffer, int32_t last_dim) {
  std::string text;
  for (int32_t d = 0; d < last_dim; ++d) {
    if (buffer.broadcasts(d)) continue;
    text += fmt::format("i{}*s{} + ", d, d);
  }
  return buffer.name + "[" + text + "off]";
}

std::string expr_text(const Kernel& kernel, int32_t e) {
  const Expr& expr = kernel.exprs[static_cast<size_t>(e)];
  std::vector<std::string> args;
  for (int32_t a : expr.args) args.push_back(fmt::format("v{}", a));
  switch (expr.kind) {
    case ExprKind::load:
      return index_text(kernel.buffers[static_cast<size_t>(expr.buffer)], kernel.rank);
    case ExprKind::constant:
      return fmt::format("{} : {}", constant_text(expr.value, expr.dtype), expr.dtype);
    case ExprKind::cast:
      return fmt::format("cast({}) : {}", args[0], expr.dtype);
    case ExprKind::op:
      return fmt::format("{}({}) : {}", expr.op, fmt::join(args, ", "), expr.dtype);
    case ExprKind::reduce:  // its init and combine lines print around the reduction loops
      return fmt::format("acc{} : {}", e, expr.dtype);
    case ExprKind::reduce_count:
      return fmt::format("count : {}", expr.dtype);
  }
  return "?";
}

std::string loop_text(int32_t begin, int32_t end) {
  std::vector<std::string> vars;
  for (int32_t d = begin; d < end; ++d) vars.push_back(fmt::format("i{}", d));
  return fmt::format("for {}", fmt::join(vars, ", "));
}

}  // namespace

std::string print(const Kernel& kernel) {
  std::vector<std::string> params;
  for (const Buffer& buffer : kernel.buffers) {
    std::string p = fmt::format("{}: {}", buffer.name, buffer.dtype);
    std::vector<int32_t> bcast;
    for (int32_t d = 0; d < kernel.rank; ++d)
      if (buffer.broadcasts(d)) bcast.push_back(d);
    if (!bcast.empty()) p += fmt::format(" bcast[{}]", fmt::join(bcast, ","));
    std::vector<std::string> views;
    for (const ViewStep& v : buffer.views) views.push_back(v.op->name + v.attrs.to_string());
    if (!views.empty()) p += fmt::format(" via {}", fmt::join(views, " "));
    params.push_back(std::move(p));
  }
  std::string out = fmt::format("kernel {}({}) sizes[{}]", kernel.name, fmt::join(params, ", "),
                                kernel.rank);
  if (kernel.num_reduced > 0) out += fmt::format(" reduce[{}]", kernel.num_reduced);
  if (!kernel.shape.empty()) out += fmt::format("  # lowered at [{}]", fmt::join(kernel.shape, ","));
  out += " {\n";

  const std::vector<bool> after = after_reduction(kernel);
  const int32_t kept = kernel.rank - kernel.num_reduced;
  std::string indent = "  ";
  auto line = [&](const std::string& text) { out += indent + text + "\n"; };
  const std::vector<bool> inner = inner_stores(kernel);
  auto store_lines = [&](bool inside) {
    for (size_t i = 0; i < kernel.stores.size(); ++i) {
      if (inner[i] != inside) continue;
      const Store& s = kernel.stores[i];
      const Buffer& b = kernel.buffers[static_cast<size_t>(s.buffer)];
      line(fmt::format("{} = v{}", index_text(b, inside ? kernel.rank : kept), s.expr));
    }
  };
  if (kept > 0) {
    line(loop_text(0, kept) + " {");
    indent += "  ";
  }
  if (kernel.num_reduced > 0) {
    for (size_t e = 0; e < kernel.exprs.size(); ++e)
      if (kernel.exprs[e].kind == ExprKind::reduce)
        line(fmt::format("acc{} = {}", e, constant_text(kernel.exprs[e].value, kernel.exprs[e].dtype)));
    line(loop_text(kept, kernel.rank) + " {");
    indent += "  ";
  }
  for (size_t e = 0; e < kernel.exprs.size(); ++e) {
    if (after[e]) continue;
    line(fmt::format("v{} = {}", e, expr_text(kernel, static_cast<int32_t>(e))));
  }
  if (kernel.num_reduced > 0) {
    for (size_t e = 0; e < kernel.exprs.size(); ++e)
      if (kernel.exprs[e].kind == ExprKind::reduce)
        line(fmt::format("acc{} = {}(acc{}, v{})", e, kernel.exprs[e].op, e, kernel.exprs[e].args[0]));
    store_lines(true);
    indent.resize(indent.size() - 2);
    line("}");
    for (size_t e = 0; e < kernel.exprs.size(); ++e)
      if (after[e]) line(fmt::format("v{} = {}", e, expr_text(kernel, static_cast<int32_t>(e))));
  }
  store_lines(false);
  if (kept > 0) {
    indent.resize(indent.size() - 2);
    line("}");
  }
  out += "}\n";
  return out;
}

}  // namespace kiln::compiler::codegen
