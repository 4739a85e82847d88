// CPU kernels of the reductions: the ops (how each folds its elements) and the kernels that
// run them over the loops of kernels/cpu/reduce_loops.h.
#include "core/ops/reduce.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/registry.h"
#include "kernels/cpu/reduce_loops.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;
using reduction::Plan;
using reduction::run;

// ---- the ops ----

template <class T>
constexpr bool kFloating = std::is_floating_point_v<compute_t<T>>;
// Sums accumulate floats in double and integers in wrapping 64-bit arithmetic.
template <class T>
using wide_t = std::conditional_t<kFloating<T>, double, uint64_t>;

template <class T, class A>
T narrow(A a) {
  if constexpr (std::is_same_v<T, bool>)
    return a != A(0);
  else
    return static_cast<T>(static_cast<compute_t<T>>(a));
}

enum class Sum { sum, prod, mean };

template <class T, Sum kind, class Out = T>
struct SumOp {
  using In = T;
  using Acc = wide_t<T>;
  static constexpr bool kIndexed = false;
  Out* out;
  double count = 1;  // the mean's divisor
  Acc init(int64_t) const { return Acc(kind == Sum::prod ? 1 : 0); }
  void step(Acc& a, compute_t<T> x, int64_t, int64_t) const {
    if constexpr (kind == Sum::prod)
      a *= static_cast<Acc>(x);
    else
      a += static_cast<Acc>(x);
  }
  void combine(Acc& a, const Acc& b) const {
    if constexpr (kind == Sum::prod)
      a *= b;
    else
      a += b;
  }
  void store(int64_t o, const Acc& a) const {
    if constexpr (kind == Sum::mean)
      out[o] = narrow<Out>(static_cast<double>(a) / count);
    else
      out[o] = narrow<Out>(a);
  }
};

template <class C>
C lowest() {
  if constexpr (std::numeric_limits<C>::has_infinity)
    return -std::numeric_limits<C>::infinity();
  else
    return std::numeric_limits<C>::lowest();
}
template <class C>
C highest() {
  if constexpr (std::numeric_limits<C>::has_infinity)
    return std::numeric_limits<C>::infinity();
  else
    return std::numeric_limits<C>::max();
}

// amax, amin and the full max and min: NaN-propagating.
template <class T, bool is_max, class Out = T>
struct ExtremeOp {
  using In = T;
  using Acc = compute_t<T>;
  static constexpr bool kIndexed = false;
  Out* out;
  Acc init(int64_t) const { return is_max ? lowest<Acc>() : highest<Acc>(); }
  void step(Acc& a, Acc x, int64_t, int64_t) const { combine(a, x); }
  void combine(Acc& a, const Acc& b) const {
    a = is_max ? scalar::maximum(a, b) : scalar::minimum(a, b);
  }
  void store(int64_t o, const Acc& a) const { out[o] = narrow<Out>(a); }
};

// max and min along a dim, argmax and argmin: the first extreme position, a NaN first.
template <class T, bool is_max>
struct ArgExtremeOp {
  using In = T;
  using C = compute_t<T>;
  struct Acc {
    C value;
    int64_t index;
  };
  static constexpr bool kIndexed = true;
  T* values;  // may be null
  int64_t* indices;
  static bool better(C x, C than) {
    if (scalar::is_nan(than)) return false;
    if (scalar::is_nan(x)) return true;
    return is_max ? x > than : x < than;
  }
  Acc init(int64_t) const { return {C(0), -1}; }
  void step(Acc& a, C x, int64_t r, int64_t) const {
    if (a.index < 0 || better(x, a.value)) a = {x, r};
  }
  void combine(Acc& a, const Acc& b) const {
    if (b.index >= 0 && (a.index < 0 || better(b.value, a.value))) a = b;
  }
  void store(int64_t o, const Acc& a) const {
    if (values) values[o] = narrow<T>(a.value);
    indices[o] = a.index;
  }
};

// var and std, second pass: squared deviations from the mean of the first pass.
template <class T>
struct SquaredDeviationsOp {
  using In = T;
  using Acc = double;
  static constexpr bool kIndexed = false;
  const double* mean;
  T* out;
  double divisor;
  bool root;
  Acc init(int64_t) const { return 0; }
  void step(Acc& a, compute_t<T> x, int64_t, int64_t o) const {
    const double d = static_cast<double>(x) - mean[o];
    a += d * d;
  }
  void combine(Acc& a, const Acc& b) const { a += b; }
  void store(int64_t o, const Acc& a) const {
    const double v = a / divisor;
    out[o] = narrow<T>(root ? std::sqrt(v) : v);
  }
};

// logsumexp, second pass: sum of exp(x - shift), shift being the max (0 when infinite).
template <class T>
struct SumExpOp {
  using In = T;
  using C = compute_t<T>;
  using Acc = double;
  static constexpr bool kIndexed = false;
  const C* shift;
  T* out;
  Acc init(int64_t) const { return 0; }
  void step(Acc& a, C x, int64_t, int64_t o) const { a += scalar::exp(C(x - shift[o])); }
  void combine(Acc& a, const Acc& b) const { a += b; }
  void store(int64_t o, const Acc& a) const {
    out[o] = narrow<T>(std::log(a) + static_cast<double>(shift[o]));
  }
};

enum class Norm { zero, one, two, inf, neg_inf, general };

template <class T, Norm kind>
struct NormOp {
  using In = T;
  using C = compute_t<T>;
  using Acc = std::conditional_t<kind == Norm::inf || kind == Norm::neg_inf, C, double>;
  static constexpr bool kIndexed = false;
  T* out;
  double p;
  Acc init(int64_t) const { return kind == Norm::neg_inf ? highest<Acc>() : Acc(0); }
  void step(Acc& a, C x, int64_t, int64_t) const {
    const C m = scalar::abs(x);
    if constexpr (kind == Norm::zero)
      a += x != C(0);
    else if constexpr (kind == Norm::one)
      a += static_cast<double>(m);
    else if constexpr (kind == Norm::two)
      a += static_cast<double>(m) * static_cast<double>(m);
    else if constexpr (kind == Norm::general)
      a += std::pow(static_cast<double>(m), p);
    else
      combine(a, m);
  }
  void combine(Acc& a, const Acc& b) const {
    if constexpr (kind == Norm::inf)
      a = scalar::maximum(a, b);
    else if constexpr (kind == Norm::neg_inf)
      a = scalar::minimum(a, b);
    else
      a += b;
  }
  void store(int64_t o, const Acc& a) const {
    if constexpr (kind == Norm::two)
      out[o] = narrow<T>(std::sqrt(a));
    else if constexpr (kind == Norm::general)
      out[o] = narrow<T>(std::pow(a, 1.0 / p));
    else
      out[o] = narrow<T>(a);
  }
};

template <bool is_all>
struct AllAnyOp {
  using In = bool;
  using Acc = bool;
  static constexpr bool kIndexed = false;
  bool* out;
  Acc init(int64_t) const { return is_all; }
  void step(Acc& a, bool x, int64_t, int64_t) const { combine(a, x); }
  void combine(Acc& a, const Acc& b) const { a = is_all ? (a && b) : (a || b); }
  void store(int64_t o, const Acc& a) const { out[o] = a; }
};

// ---- the kernels ----

const DimList& dims_attr(const Attrs& a) {
  static const DimList kAll;
  return a.has("dims") ? a.ints("dims") : kAll;
}

template <Sum kind>
void sum_kernel(Span in, Span out, const Attrs& a) {
  const DType t = out[0].dtype();
  const Plan p(in[0], t, dims_attr(a),
               kind == Sum::sum    ? "sum"
               : kind == Sum::prod ? "prod"
                                   : "mean");
  const Tensor o = p.target(out[0]);
  visit_dtype(t, [&]<class T>() {
    run(p, SumOp<T, kind>{o.data_ptr<T>(), static_cast<double>(p.layout().n_red)});
  });
  p.finish(out[0], o);
}

template <bool is_max>
void extreme_kernel(const Tensor& in, const Tensor& out, const DimList& dims, const char* op) {
  const Plan p(in, in.dtype(), dims, op);
  const Tensor o = p.target(out);
  visit_dtype(in.dtype(), [&]<class T>() { run(p, ExtremeOp<T, is_max>{o.data_ptr<T>()}); });
  p.finish(out, o);
}

template <bool is_max>
void arg_extreme(const Tensor& in, const Tensor* values, const Tensor& indices, const DimList& dims,
                 const char* op) {
  const Plan p(in, in.dtype(), dims, op, true);
  const Tensor v = values ? p.target(*values) : Tensor(), i = p.target(indices);
  visit_dtype(in.dtype(), [&]<class T>() {
    run(p, ArgExtremeOp<T, is_max>{values ? v.data_ptr<T>() : nullptr, i.data_ptr<int64_t>()});
  });
  if (values) p.finish(*values, v);
  p.finish(indices, i);
}

template <bool is_max>
void max_min_kernel(Span in, Span out, const Attrs& a) {
  const char* op = is_max ? "max" : "min";
  if (!a.has("dim")) return extreme_kernel<is_max>(in[0], out[0], {}, op);
  arg_extreme<is_max>(in[0], &out[0], out[1], {a.i("dim")}, op);
}

template <bool is_max>
void amax_amin_kernel(Span in, Span out, const Attrs& a) {
  extreme_kernel<is_max>(in[0], out[0], dims_attr(a), is_max ? "amax" : "amin");
}

template <bool is_max>
void arg_kernel(Span in, Span out, const Attrs& a) {
  const DimList dims = a.has("dim") ? DimList{a.i("dim")} : DimList{};
  arg_extreme<is_max>(in[0], nullptr, out[0], dims, is_max ? "argmax" : "argmin");
}

template <bool root>
void var_std_kernel(Span in, Span out, const Attrs& a) {
  const char* name = root ? "std" : "var";
  const Plan p(in[0], in[0].dtype(), dims_attr(a), name);
  const Tensor o = p.target(out[0]);
  const double n = static_cast<double>(p.layout().n_red);
  const double divisor = std::max(0.0, n - a.f("correction"));
  std::vector<double> mean(static_cast<size_t>(p.layout().n_out));
  visit_floating(in[0].dtype(), name, [&]<class T>() {
    run(p, SumOp<T, Sum::mean, double>{mean.data(), n});
    run(p, SquaredDeviationsOp<T>{mean.data(), o.data_ptr<T>(), divisor, root});
  });
  p.finish(out[0], o);
}

void logsumexp_kernel(Span in, Span out, const Attrs& a) {
  const DType t = out[0].dtype();
  const Plan p(in[0], t, dims_attr(a), "logsumexp");
  const Tensor o = p.target(out[0]);
  visit_floating(t, "logsumexp", [&]<class T>() {
    using C = compute_t<T>;
    std::vector<C> shift(static_cast<size_t>(p.layout().n_out));
    if (p.layout().n_red > 0) run(p, ExtremeOp<T, true, C>{shift.data()});
    for (C& s : shift)
      if (std::isinf(s)) s = 0;  // all -inf gives log(0) = -inf; any +inf gives +inf
    run(p, SumExpOp<T>{shift.data(), o.data_ptr<T>()});
  });
  p.finish(out[0], o);
}

template <bool is_all>
void all_any_kernel(Span in, Span out, const Attrs& a) {
  if (out[0].dtype() != DType::boolean) {  // u8 inputs: reduce into bool, then convert
    const Tensor tmp = make_tensor(out[0].shape(), DType::boolean, out[0].device());
    all_any_kernel<is_all>(in, std::span<const Tensor>(&tmp, 1), a);
    Tensor(out[0]).copy_(tmp);
    return;
  }
  const Plan p(in[0], DType::boolean, dims_attr(a), is_all ? "all" : "any");
  const Tensor o = p.target(out[0]);
  run(p, AllAnyOp<is_all>{o.data_ptr<bool>()});
  p.finish(out[0], o);
}

void norm_kernel(Span in, Span out, const Attrs& a) {
  const double p = a.f("p");
  const Plan prep(in[0], in[0].dtype(), dims_attr(a), "norm");
  const Tensor o = prep.target(out[0]);
  visit_floating(in[0].dtype(), "norm", [&]<class T>() {
    auto with = [&]<Norm kind>() { run(prep, NormOp<T, kind>{o.data_ptr<T>(), p}); };
    if (p == 0)
      with.template operator()<Norm::zero>();
    else if (p == 1)
      with.template operator()<Norm::one>();
    else if (p == 2)
      with.template operator()<Norm::two>();
    else if (std::isinf(p) && p > 0)
      with.template operator()<Norm::inf>();
    else if (std::isinf(p))
      with.template operator()<Norm::neg_inf>();
    else
      with.template operator()<Norm::general>();
  });
  prep.finish(out[0], o);
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("sum", cpu, sum_kernel<Sum::sum>);
    register_kernel("prod", cpu, sum_kernel<Sum::prod>);
    register_kernel("mean", cpu, sum_kernel<Sum::mean>);
    register_kernel("max", cpu, max_min_kernel<true>);
    register_kernel("min", cpu, max_min_kernel<false>);
    register_kernel("amax", cpu, amax_amin_kernel<true>);
    register_kernel("amin", cpu, amax_amin_kernel<false>);
    register_kernel("argmax", cpu, arg_kernel<true>);
    register_kernel("argmin", cpu, arg_kernel<false>);
    register_kernel("var", cpu, var_std_kernel<false>);
    register_kernel("std", cpu, var_std_kernel<true>);
    register_kernel("logsumexp", cpu, logsumexp_kernel);
    register_kernel("all", cpu, all_any_kernel<true>);
    register_kernel("any", cpu, all_any_kernel<false>);
    register_kernel("norm", cpu, norm_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
