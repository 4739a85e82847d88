// Tensor printing in the style of PyTorch's repr: aligned columns, "1." for whole floats,
// scientific notation when magnitudes spread widely, "..." when the tensor is large.
#include <cmath>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kThreshold = 1000;  // summarize above this many elements
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum class Mode { integer, whole_float, fixed, scientific, boolean } mode;
  size_t width = 1;

  std::string one(double v) const {
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
  std::string padded(double v) const {
    std::string s = one(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

Formatter make_formatter(const std::vector<double>& values, DType dtype) {
  Formatter f;
  if (dtype == DType::boolean) f.mode = Formatter::Mode::boolean;
  else if (!is_floating(dtype)) f.mode = Formatter::Mode::integer;
  else {
    bool whole = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : values) {
      if (!std::isfinite(v)) continue;
      whole = whole && std::nearbyint(v) == v;
      const double a = std::fabs(v);
      if (a == 0) continue;
      max_abs = std::max(max_abs, a);
      min_abs = std::min(min_abs, a);
    }
    if (whole) f.mode = max_abs > 1e8 ? Formatter::Mode::scientific : Formatter::Mode::whole_float;
    else if (max_abs > 1e8 || min_abs < 1e-4 || max_abs / min_abs > 1000)
      f.mode = Formatter::Mode::scientific;
    else f.mode = Formatter::Mode::fixed;
  }
  for (double v : values) f.width = std::max(f.width, f.one(v).size());
  return f;
}

struct Printer {
  const std::vector<double>& values;
  const Shape& shape;
  Shape strides;
  Formatter f;
  bool summarize;

  void row(std::string& out, int64_t dim, int64_t offset, size_t indent) const {
    if (dim == static_cast<int64_t>(shape.size())) {
      out += f.padded(values[offset]);
      return;
    }
    const int64_t n = shape[dim];
    const bool last = dim + 1 == static_cast<int64_t>(shape.size());
    std::string sep = ",";
    if (last) sep += ' ';
    else sep.append(shape.size() - dim - 1, '\n').append(indent + 1, ' ');
    out += "[";
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        out += "...";
        out += sep;
        i = n - kEdgeItems;
      }
      row(out, dim + 1, offset + i * strides[dim], indent + 1);
      if (i + 1 < n) out += sep;
    }
    out += "]";
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Tensor c = to(Device::cpu()).contiguous();
  std::vector<double> values(static_cast<size_t>(c.numel()));
  visit_dtype(c.dtype(), [&]<class T>() {
    const T* p = static_cast<const T*>(c.data_ptr());
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
  });
  std::string out = "tensor(";
  if (numel() == 0) {
    out += "[]";
  } else {
    const bool summarize = numel() > kThreshold;
    Formatter f = make_formatter(values, dtype());
    Printer p{values, shape(), contiguous_strides(shape()), f, summarize};
    p.row(out, 0, 0, 7);
  }
  if (numel() == 0 && dim() != 1) out += ", size=" + shape_str(shape());
  if (!device().is_cpu()) out += fmt::format(", device='{}'", device());
  if (dtype() != DType::f32 && dtype() != DType::i64 && dtype() != DType::boolean)
    out += fmt::format(", dtype={}", dtype());
  return out + ")";
}

}  // namespace kiln
