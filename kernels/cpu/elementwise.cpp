// CPU kernels of the elementwise ops, each a loop over a function of kernels/scalar.h.
#include "kernels/cpu/elementwise.h"

#include <cstdint>
#include <type_traits>

#include "core/ops/elementwise_table.h"
#include "kernels/cpu/loops.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// out = F(x) for ops whose result is floating.
template <auto F>
void unary_floating(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(in, true);
  into(out[0], c, [&](const Tensor& o) {
    visit_floating(c, "elementwise", [&]<class T>() { map<T, T>(o, F, as_dtype(in[0], c)); });
  });
}

// out = F(x) in the input's own dtype.
template <auto F>
void unary_same(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(in, false);
  into(out[0], c, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() { map<T, T>(o, F, as_dtype(in[0], c)); });
  });
}

// out = F(a, b) in the promoted dtype (made floating for `floating` ops).
template <auto F, bool floating>
void binary(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(in, floating);
  into(out[0], c, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() {
      map<T, T, T>(o, F, as_dtype(in[0], c), as_dtype(in[1], c));
    });
  });
}

// out (bool) = F(a, b) compared in the promoted dtype.
template <auto F>
void compare(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(in, false);
  into(out[0], DType::boolean, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() {
      map<bool, T, T>(o, F, as_dtype(in[0], c), as_dtype(in[1], c));
    });
  });
}

// Logical ops read their operands as bool.
template <auto F, int arity>
void logical(Span in, Span out, const Attrs&) {
  into(out[0], DType::boolean, [&](const Tensor& o) {
    if constexpr (arity == 1) map<bool, bool>(o, F, as_dtype(in[0], DType::boolean));
    else map<bool, bool, bool>(o, F, as_dtype(in[0], DType::boolean), as_dtype(in[1], DType::boolean));
  });
}

// The kernel of an op of core/ops/elementwise_table.h: F, its scalar function, looped as
// its category says.
template <Elementwise category, int arity, auto F>
void table_op(Span in, Span out, const Attrs& attrs) {
  if constexpr (category == Elementwise::logical) logical<F, arity>(in, out, attrs);
  else if constexpr (category == Elementwise::compare) compare<F>(in, out, attrs);
  else if constexpr (arity == 1 && category == Elementwise::floating) unary_floating<F>(in, out, attrs);
  else if constexpr (arity == 1) unary_same<F>(in, out, attrs);
  else binary<F, category == Elementwise::floating>(in, out, attrs);
}

// a + alpha * b and a - alpha * b
template <bool subtract>
void add_sub(Span in, Span out, const Attrs& attrs) {
  if (!attrs.has("alpha")) {
    if constexpr (subtract) binary<[](auto a, auto b) { return scalar::sub(a, b); }, false>(in, out, attrs);
    else binary<[](auto a, auto b) { return scalar::add(a, b); }, false>(in, out, attrs);
    return;
  }
  const Scalar alpha = attrs.scalar("alpha");
  const DType c = compute_dtype(in, false);
  into(out[0], c, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() {
      using C = compute_t<T>;
      const C k = alpha.to<C>();
      map<T, T, T>(
          o, [k](C a, C b) { return subtract ? C(a - k * b) : C(a + k * b); }, as_dtype(in[0], c),
          as_dtype(in[1], c));
    });
  });
}

void gelu(Span in, Span out, const Attrs& attrs) {
  const bool tanh_form = attrs.str("approximate") == "tanh";
  const DType c = compute_dtype(in, true);
  into(out[0], c, [&](const Tensor& o) {
    visit_floating(c, "gelu", [&]<class T>() {
      // The form chosen outside the loop: a loop that also holds the tanh call does not
      // vectorize (1M floats: 5.2 ms against 1.5 ms for the erf form alone).
      if (tanh_form)
        map<T, T>(o, [](auto x) { return scalar::gelu(x, true); }, as_dtype(in[0], c));
      else
        map<T, T>(o, [](auto x) { return scalar::gelu(x, false); }, as_dtype(in[0], c));
    });
  });
}

void gelu_backward(Span in, Span out, const Attrs& attrs) {
  const bool tanh_form = attrs.str("approximate") == "tanh";
  const DType c = compute_dtype(in, true);
  into(out[0], c, [&](const Tensor& o) {
    visit_floating(c, "gelu_backward", [&]<class T>() {
      // The form chosen outside the loop, as in gelu, so that the erf form's loop vectorizes.
      if (tanh_form)
        map<T, T, T>(o, [](auto g, auto x) { return scalar::gelu_backward(g, x, true); },
                     as_dtype(in[0], c), as_dtype(in[1], c));
      else
        map<T, T, T>(o, [](auto g, auto x) { return scalar::gelu_backward(g, x, false); },
                     as_dtype(in[0], c), as_dtype(in[1], c));
    });
  });
}

void softplus(Span in, Span out, const Attrs& attrs) {
  const DType c = compute_dtype(in, true);
  into(out[0], c, [&](const Tensor& o) {
    visit_floating(c, "softplus", [&]<class T>() {
      using C = compute_t<T>;
      const C beta = static_cast<C>(attrs.f("beta")), threshold = static_cast<C>(attrs.f("threshold"));
      map<T, T>(o, [=](C x) { return scalar::softplus(x, beta, threshold); }, as_dtype(in[0], c));
    });
  });
}

void clamp(Span in, Span out, const Attrs& attrs) {
  const auto lo = attrs.optional_scalar("min"), hi = attrs.optional_scalar("max");
  std::vector<TensorMeta> metas{TensorMeta::of(in[0])};
  for (const auto& bound : {lo, hi})
    if (bound) metas.push_back(TensorMeta{{}, bound->kind(), Device::cpu(), true});
  const DType c = result_type(metas);
  into(out[0], c, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() {
      using C = compute_t<T>;
      if constexpr (std::is_same_v<C, bool>) {
        fail("clamp: bool tensors are not supported");
      } else {
        const C l = lo ? lo->to<C>() : C(0), h = hi ? hi->to<C>() : C(0);
        const bool has_lo = lo.has_value(), has_hi = hi.has_value();
        map<T, T>(o, [=](C x) {
          if (has_lo) x = scalar::maximum(x, l);
          if (has_hi) x = scalar::minimum(x, h);
          return x;
        }, as_dtype(in[0], c));
      }
    });
  });
}

// The unsigned integer of T's size.
template <class T>
using bits_t = std::conditional_t<sizeof(T) == 1, uint8_t,
               std::conditional_t<sizeof(T) == 2, uint16_t,
               std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;

// where picks bit patterns with a mask: no conversion of 16-bit values, and no branch on
// the condition (a branch per element ran 30x slower than a copy on random masks).
void where(Span in, Span out, const Attrs&) {
  const DType c = compute_dtype(in.subspan(1), false);
  into(out[0], c, [&](const Tensor& o) {
    visit_dtype(c, [&]<class T>() {
      using U = bits_t<T>;
      static_assert(sizeof(U) == sizeof(T));
      // The condition read as bytes (bools are 0 or 1): GCC does not vectorize the loop
      // with a bool operand.
      map<U, uint8_t, U, U>(o, [](uint8_t k, U a, U b) {
        const U m = static_cast<U>(U(0) - static_cast<U>(k));
        return static_cast<U>((a & m) | (b & static_cast<U>(~m)));
      }, in[0], as_dtype(in[1], c), as_dtype(in[2], c));
    });
  });
}

void fill(Span, Span out, const Attrs& attrs) {
  const Scalar v = attrs.scalar("value");
  visit_dtype(out[0].dtype(), [&]<class T>() {
    const T value = v.to<T>();
    map<T>(out[0], [value]() { return value; });
  });
}

void cast(Span in, Span out, const Attrs&) {
  const Tensor& src = in[0];
  const Tensor& dst = out[0];
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() &&
      src.shape() == dst.shape()) {
    const size_t nbytes = static_cast<size_t>(src.numel()) * src.itemsize();
    const char* s = static_cast<const char*>(src.data_ptr());
    char* d = static_cast<char*>(dst.data_ptr());
    if (s == d) return;
    parallel_for(static_cast<int64_t>(nbytes), 1 << 20, [&](int64_t b, int64_t e) {
      std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
    });
    return;
  }
  visit_dtype(dst.dtype(), [&]<class O>() {
    visit_dtype(src.dtype(), [&]<class I>() {
      map<O, I>(dst, [](auto x) {
        if constexpr (std::is_same_v<O, bool>) return x != decltype(x)(0);
        else return x;
      }, src);
    });
  });
}

// A copy to the CPU: from the CPU, a cast; from a device, the bytes of a contiguous copy
// made there (through the backend's copy_bytes).
void to_device_cpu(Span in, Span out, const Attrs& attrs) {
  if (in[0].device().is_cpu()) return cast(in, out, attrs);
  const Tensor src = in[0].contiguous();
  copy_bytes(out[0].data_ptr(), out[0].device(), src.data_ptr(), src.device(),
             static_cast<size_t>(src.numel()) * src.itemsize());
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
#define KILN_REGISTER_SCALAR_OP(name, category, arity, bools, policy) \
  register_kernel(#name, cpu, table_op<Elementwise::category, arity, [](auto... x) { return scalar::name(x...); }>);
    KILN_SCALAR_OPS(KILN_REGISTER_SCALAR_OP)
#undef KILN_REGISTER_SCALAR_OP
    register_kernel("gelu", cpu, gelu);
    register_kernel("gelu_backward", cpu, gelu_backward);
    register_kernel("softplus", cpu, softplus);
    register_kernel("clamp", cpu, clamp);
    register_kernel("add", cpu, add_sub<false>);
    register_kernel("sub", cpu, add_sub<true>);
    register_kernel("where", cpu, where);
    register_kernel("fill", cpu, fill);
    register_kernel("cast", cpu, cast);
    register_kernel("clone", cpu, cast);
    register_kernel("to_device", cpu, to_device_cpu);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
