#pragma once
// Helpers shared by kiln's tests: reading any tensor back as doubles, naive index loops
// for reference implementations, strided copies of inputs, and closeness checks that
// print both tensors when they fail.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <kiln.h>

#include "kernels/cpu/wide.h"

namespace kiln::testing {

// Element at a multi-index, as a double (any dtype, any strides).
inline double at(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return visit_dtype(t.dtype(), [&]<class T>() {
    const T* p = static_cast<const T*>(t.data_ptr()) + off;
    return static_cast<double>(static_cast<compute_t<T>>(*p));
  });
}

// Calls f(idx) for every multi-index of `shape`, last dim fastest.
inline void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& f) {
  if (numel_of(shape) == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  while (true) {
    f(idx);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// All elements in row-major order, as doubles.
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  for_each_index(t.shape(), [&](const std::vector<int64_t>& i) { out.push_back(at(t, i)); });
  return out;
}

// A tensor of `dtype` holding `v` (row-major) in `shape`. An empty shape means 0-d for
// one value and [v.size()] otherwise.
inline Tensor tensor_of(const std::vector<double>& v, Shape shape, DType dtype = DType::f32) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  return from_vector<double>(v, std::move(shape)).to(dtype);
}

// The same values as `t`, laid out with gaps (every other element of a larger buffer), so
// that kernels see a non-contiguous input.
inline Tensor strided_copy(const Tensor& t) {
  if (t.dim() == 0) return t.clone();
  Shape big = t.shape();
  big.back() *= 2;
  Tensor b = zeros(big, {.dtype = t.dtype()});
  Tensor view = b.slice(-1, 0, big.back(), 2);
  view.copy_(t);
  REQUIRE_FALSE((view.is_contiguous() && t.numel() > 1 && t.shape().back() > 1));
  return view;
}

// A copy of a 2-d or more tensor whose last two dims are stored transposed.
inline Tensor transposed_copy(const Tensor& t) {
  REQUIRE(t.dim() >= 2);
  return t.transpose(-1, -2).contiguous().transpose(-1, -2);
}

inline std::string describe(const Tensor& t) { return t.meta_str() + "\n" + t.str(); }

// Elementwise |a - e| <= atol + rtol |e|, NaNs equal to NaNs; shapes must match.
inline bool allclose(const Tensor& a, const Tensor& e, double rtol, double atol) {
  if (a.shape() != e.shape()) return false;
  std::vector<double> va = values(a), ve = values(e);
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) && std::isnan(ve[i])) continue;
    if (std::isinf(ve[i]) && va[i] == ve[i]) continue;
    if (!(std::fabs(va[i] - ve[i]) <= atol + rtol * std::fabs(ve[i]))) return false;
  }
  return true;
}

#define KILN_CHECK_CLOSE(actual, expected, rtol, atol)                                      \
  do {                                                                                      \
    const ::kiln::Tensor kiln_a_ = (actual), kiln_e_ = (expected);                          \
    INFO("actual:   " << ::kiln::testing::describe(kiln_a_));                               \
    INFO("expected: " << ::kiln::testing::describe(kiln_e_));                               \
    CHECK(::kiln::testing::allclose(kiln_a_, kiln_e_, (rtol), (atol)));                     \
  } while (0)

// Same dtype, shape and bytes (both undefined counts as equal): compiled against eager
// bit for bit.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t n = static_cast<size_t>(ca.numel()) * ca.itemsize();
  return n == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), n) == 0;
}

// Exact equality of values and shape (dtypes may differ).
#define KILN_CHECK_EQUAL(actual, expected) KILN_CHECK_CLOSE(actual, expected, 0.0, 0.0)

// Every dtype, and the floating ones, for GENERATE.
inline const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                             DType::i64, DType::i32, DType::u8,  DType::boolean};
inline const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

// A tolerance that suits results computed in `dtype`.
inline double tol(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0;
  }
}

// Small non-negative integers (0/1 for bool) that every dtype holds exactly.
inline Tensor small_integers(const Shape& shape, DType dtype, int64_t seed = 0) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    const auto k = static_cast<int64_t>(i) + seed;
    v[i] = dtype == DType::boolean ? static_cast<double>((k * 5 + 1) % 3 == 0)
                                   : static_cast<double>((k * 7 + 3) % 13);
  }
  return tensor_of(v, shape, dtype);
}

// An f32 tensor of `v`; an empty shape means 0-d for one value and [v.size()] otherwise.
inline Tensor f32s(const std::vector<float>& v, Shape shape = {}) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  return from_vector<float>(v, std::move(shape));
}

// Sample mean and (n - 1) standard deviation, for statistical checks.
inline double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
inline double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// Leaves for gradcheck: f64 normal values from a seeded generator, requiring grad; the
// strided and transposed forms are non-contiguous.
inline Tensor random_leaf(Shape shape, uint64_t seed = 1) {
  Generator gen(seed);
  Tensor t = randn(std::move(shape), {.dtype = DType::f64}, &gen);
  t.requires_grad_();
  return t;
}
inline Tensor random_strided_leaf(Shape shape, uint64_t seed = 2) {
  Generator gen(seed);
  Tensor t = strided_copy(randn(std::move(shape), {.dtype = DType::f64}, &gen));
  t.requires_grad_();
  return t;
}
inline Tensor random_transposed_leaf(Shape shape, uint64_t seed = 2) {
  Generator gen(seed);
  Tensor t = transposed_copy(randn(std::move(shape), {.dtype = DType::f64}, &gen));
  t.requires_grad_();
  return t;
}

// Whether this CPU runs kiln's AVX-512 loops (cpu::set_wide_loops(true) succeeds, and
// leaves them on); tests comparing the plain and the wide builds' bits run only where so.
inline bool wide_loops_available() {
  try {
    cpu::set_wide_loops(true);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace kiln::testing
