#pragma once
// Element types, their sizes and names, PyTorch's promotion rules, and visit_dtype, which
// calls a templated lambda with the C++ type of a DType.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/half.h"

namespace kiln {

enum class DType : uint8_t { f32, f64, f16, bf16, i64, i32, u8, boolean };
inline constexpr int kNumDTypes = 8;

std::string_view name(DType t);  // "f32", "bool", ...
size_t itemsize(DType t);
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
inline bool is_integral(DType t, bool include_bool = false) {
  return t == DType::i64 || t == DType::i32 || t == DType::u8 ||
         (include_bool && t == DType::boolean);
}
inline bool is_reduced_float(DType t) { return t == DType::f16 || t == DType::bf16; }

// The type both operands convert to (torch.promote_types).
DType promote_types(DType a, DType b);
// The default floating type (f32), used for integer inputs of ops that produce floats.
inline constexpr DType kDefaultFloat = DType::f32;

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// The type arithmetic happens in: f32 for the 16-bit floats, the type itself otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

// visit_dtype(t, [&]<class T>() { ... }) calls the lambda with T the C++ type of t.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  fail("visit_dtype: invalid dtype {}", static_cast<int>(t));
}

// As visit_dtype, for the floating types only; others are an error naming `op`.
template <class F>
decltype(auto) visit_floating(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: fail("{}: dtype {} is not supported (floating types only)", op, name(t));
  }
}

}  // namespace kiln

template <>
struct fmt::formatter<kiln::DType> : fmt::formatter<std::string_view> {
  auto format(kiln::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(kiln::name(t), ctx);
  }
};
