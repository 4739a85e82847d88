#pragma once
// Scalar: a number operand (`x * 0.5`, `x + 1`). It keeps whether it was written as a
// bool, an integer or a floating value, which decides type promotion as in PyTorch.
#include <cstdint>
#include <limits>
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
  Scalar(T v)
      : kind_(DType::f64), i_(truncated(static_cast<double>(v))), d_(static_cast<double>(v)) {}
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}

  // bool, i64 or f64: the category the number was written in.
  DType kind() const { return kind_; }
  bool is_floating() const { return kind_ == DType::f64; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  // The number as a T; an error when an integer type cannot hold it (NaN, inf, out of
  // range), as in PyTorch.
  template <class T> T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return kind_ == DType::f64 ? d_ != 0.0 : i_ != 0;
    } else if constexpr (std::is_integral_v<T>) {
      constexpr auto lo = std::numeric_limits<T>::min();
      constexpr auto hi = std::numeric_limits<T>::max();
      if (kind_ == DType::f64) {
        // hi as a double may round up (2^63): compare against the next value below it.
        KILN_CHECK(d_ >= static_cast<double>(lo) && d_ < static_cast<double>(hi) + 1.0,
                   "value {} cannot be converted to {} without overflow", d_, dtype_v<T>);
        return static_cast<T>(d_);
      }
      KILN_CHECK(i_ >= static_cast<int64_t>(lo) &&
                     (i_ < 0 || static_cast<uint64_t>(i_) <= static_cast<uint64_t>(hi)),
                 "value {} cannot be converted to {} without overflow", i_, dtype_v<T>);
      return static_cast<T>(i_);
    } else {
      return static_cast<T>(kind_ == DType::f64 ? d_ : static_cast<double>(i_));
    }
  }

 private:
  // The integer part of v, or 0 where an int64 cannot hold it (inf, NaN, |v| >= 2^63): a
  // plain cast would be undefined behaviour there (the IR fuzzer found `{beta=$-inf}`), and
  // to<T>() refuses those values anyway.
  static int64_t truncated(double v) {
    return v >= -0x1p63 && v < 0x1p63 ? static_cast<int64_t>(v) : 0;
  }

  DType kind_;
  int64_t i_;
  double d_;
};

}  // namespace kiln
