// Tensor printing in the style of PyTorch's repr: aligned columns, "1." for whole floats,
// scientific notation when magnitudes spread widely, "..." when the tensor is large, rows
// wrapped at 80 columns.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kThreshold = 1000;  // summarize above this many elements
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;  // vectors wrap to stay within this many columns

// Elements are read as long double: exact for every i64 and for every float type.
using Value = long double;

struct Formatter {
  enum class Mode { integer, whole_float, fixed, scientific, boolean } mode;
  size_t width = 1;

  std::string one(Value v) const {
    if (mode == Mode::boolean) return v != 0 ? "True" : "False";
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (mode) {
      case Mode::integer: return fmt::format("{}", static_cast<int64_t>(v));
      case Mode::whole_float: return fmt::format("{:.0f}.", v);
      case Mode::fixed: return fmt::format("{:.4f}", v);
      default: return fmt::format("{:.4e}", v);
    }
  }
  std::string padded(Value v) const {
    std::string s = one(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

// `values` are the elements that will be printed (the edges only, when summarizing).
Formatter make_formatter(const std::vector<Value>& values, DType dtype) {
  Formatter f;
  if (!is_floating(dtype)) {
    f.mode = dtype == DType::boolean ? Formatter::Mode::boolean : Formatter::Mode::integer;
    for (Value v : values) f.width = std::max(f.width, f.one(v).size());
    return f;
  }
  // As in PyTorch, only the nonzero finite values choose the mode and the width.
  bool whole = true, any = false;
  Value max_abs = 0, min_abs = INFINITY;
  for (Value v : values) {
    if (!std::isfinite(v) || v == 0) continue;
    any = true;
    whole = whole && std::nearbyint(v) == v;
    max_abs = std::max(max_abs, std::fabs(v));
    min_abs = std::min(min_abs, std::fabs(v));
  }
  f.mode = Formatter::Mode::whole_float;
  if (!any) return f;
  const bool wide = max_abs / min_abs > 1000 || max_abs > 1e8;
  if (whole) f.mode = wide ? Formatter::Mode::scientific : Formatter::Mode::whole_float;
  else f.mode = wide || min_abs < 1e-4 ? Formatter::Mode::scientific : Formatter::Mode::fixed;
  for (Value v : values)
    if (std::isfinite(v) && v != 0) f.width = std::max(f.width, f.one(v).size());
  return f;
}

// Walks the tensor through its own strides (no contiguous copy), so a summarized print of
// a huge tensor reads only the elements it shows.
struct Printer {
  std::function<Value(int64_t)> read;  // the element at a storage offset
  const Shape& shape;
  const Shape& strides;
  bool summarize;

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  bool elided(int64_t dim) const { return summarize && shape[dim] > 2 * kEdgeItems; }

  // The elements that will be printed, in order.
  void collect(std::vector<Value>& out, int64_t dim, int64_t offset) const {
    if (dim == ndim()) {
      out.push_back(read(offset));
      return;
    }
    for (int64_t i = 0; i < shape[dim]; ++i) {
      if (elided(dim) && i == kEdgeItems) i = shape[dim] - kEdgeItems;
      collect(out, dim + 1, offset + i * strides[dim]);
    }
  }

  void row(std::string& out, const Formatter& f, int64_t dim, int64_t offset,
           int64_t indent) const {
    if (dim == ndim()) {
      out += f.padded(read(offset));
      return;
    }
    const int64_t n = shape[dim];
    out += "[";
    if (dim + 1 == ndim()) {
      std::vector<std::string> items;
      for (int64_t i = 0; i < n; ++i) {
        if (elided(dim) && i == kEdgeItems) {
          items.push_back(" ...");
          i = n - kEdgeItems;
        }
        items.push_back(f.padded(read(offset + i * strides[dim])));
      }
      const int64_t item_width = static_cast<int64_t>(f.width) + 2;  // with ", "
      const auto per_line =
          static_cast<size_t>(std::max<int64_t>(1, (kLineWidth - indent) / item_width));
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        out += items[k];
      }
      out += "]";
      return;
    }
    std::string sep = ",";
    sep.append(static_cast<size_t>(ndim() - dim - 1), '\n').append(indent + 1, ' ');
    for (int64_t i = 0; i < n; ++i) {
      if (elided(dim) && i == kEdgeItems) {
        out += "...";
        out += sep;
        i = n - kEdgeItems;
      }
      row(out, f, dim + 1, offset + i * strides[dim], indent + 1);
      if (i + 1 < n) out += sep;
    }
    out += "]";
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  report_host_read(*this, "str");  // printed values are read on the host, as item() reads
  Tensor c = to(Device::cpu());
  std::string out = "tensor(";
  if (numel() == 0) {
    out += "[]";
  } else {
    (void)c.data_ptr();  // a pending value is computed first
    const char* base = static_cast<const char*>(c.storage()->data);
    auto read = visit_dtype(c.dtype(), [&]<class T>() -> std::function<Value(int64_t)> {
      return [base](int64_t offset) {
        T v;
        std::memcpy(&v, base + offset * static_cast<int64_t>(sizeof(T)), sizeof(T));
        return static_cast<Value>(static_cast<compute_t<T>>(v));
      };
    });
    Printer p{read, c.shape(), c.strides(), numel() > kThreshold};
    std::vector<Value> shown;
    p.collect(shown, 0, c.offset());
    p.row(out, make_formatter(shown, dtype()), 0, c.offset(), static_cast<int64_t>(out.size()));
  }
  if (numel() == 0 && dim() != 1) out += ", size=" + shape_str(shape());
  if (!device().is_cpu()) out += fmt::format(", device='{}'", device());
  // An empty tensor shows any dtype but the default; others hide i64 and bool too.
  const bool implied = dtype() == DType::f32 ||
                       (numel() > 0 && (dtype() == DType::i64 || dtype() == DType::boolean));
  if (!implied) out += fmt::format(", dtype={}", dtype());
  return out + ")";
}

}  // namespace kiln
