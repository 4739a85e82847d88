#include "core/dtype.h"

namespace kiln {

std::string_view name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

size_t itemsize(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8:
    case DType::boolean: return 1;
  }
  return 0;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::boolean) return b;
  if (b == DType::boolean) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    if (is_reduced_float(a) && is_reduced_float(b)) return DType::f32;  // f16 with bf16
    return itemsize(a) >= itemsize(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integers: u8 with a signed type gives the signed type (ours are all wider).
  if (a == DType::u8) return b;
  if (b == DType::u8) return a;
  return itemsize(a) >= itemsize(b) ? a : b;
}

}  // namespace kiln
