#pragma once
// Scalar: a number operand (`x * 0.5`, `x + 1`). It keeps whether it was written as a
// bool, an integer or a floating value, which decides type promotion as in PyTorch.
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace kiln {

class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(DType::boolean), i_(v), d_(v) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  Scalar(T v) : kind_(DType::i64), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  template <class T>
    requires std::is_floating_point_v<T>
  Scalar(T v) : kind_(DType::f64), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}

  // bool, i64 or f64: the category the number was written in.
  DType kind() const { return kind_; }
  bool is_floating() const { return kind_ == DType::f64; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  template <class T> T to() const {
    if constexpr (std::is_same_v<T, bool>) return kind_ == DType::f64 ? d_ != 0.0 : i_ != 0;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(kind_ == DType::f64 ? static_cast<int64_t>(d_) : i_);
    else return static_cast<T>(kind_ == DType::f64 ? d_ : static_cast<double>(i_));
  }

 private:
  DType kind_;
  int64_t i_;
  double d_;
};

}  // namespace kiln
