// Reductions: their shape and dtype rules and their public functions. Every reduction
// takes its dims as attributes: `dims` (a list, empty for all) and `keepdim`; max and min
// with a `dim` attribute, and argmax and argmin, take one dim instead.
#include "core/ops/reduce.h"

#include <fmt/ranges.h>

#include <cmath>

#include "core/registry.h"

namespace kiln {

std::vector<bool> reduced_dims(const Shape& shape, const DimList& dims, const char* op) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (dims.empty()) return std::vector<bool>(shape.size(), true);
  const int64_t n = std::max<int64_t>(nd, 1);  // a 0-d tensor accepts dim 0 and -1
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t d : dims) {
    KILN_CHECK(d >= -n && d < n, "{}: dim {} is out of range for a tensor of shape {} (dims [{}])",
               op, d, shape_str(shape), fmt::join(dims, ","));
    const auto w = static_cast<size_t>(d < 0 ? d + n : d);
    KILN_CHECK(!seen[w], "{}: dim {} appears more than once in dims [{}] (shape {})", op, w,
               fmt::join(dims, ","), shape_str(shape));
    seen[w] = true;
  }
  if (nd == 0) return {};
  return seen;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduced, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

namespace {

const DimList& dims_attr(const Attrs& a) {
  static const DimList kAll;
  return a.has("dims") ? a.ints("dims") : kAll;
}
bool keepdim_attr(const Attrs& a) { return a.has("keepdim") && a.b("keepdim"); }

const TensorMeta& single_input(std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(in.size() == 1 && in[0].defined, "{}: expects one tensor, got {}", op,
             in.size() == 1 ? std::string("an undefined one") : metas_str(in));
  return in[0];
}

// The result shape of reducing `dims` of the input. Ops without an identity (`has_identity`
// false) reject a reduction over no elements, as PyTorch does.
Shape reduce_shape(std::span<const TensorMeta> in, const DimList& dims, bool keepdim,
                   const char* op, bool has_identity = true) {
  const TensorMeta& x = single_input(in, op);
  const std::vector<bool> reduced = reduced_dims(x.shape, dims, op);
  int64_t count = 1;
  for (size_t d = 0; d < reduced.size(); ++d)
    if (reduced[d]) count *= x.shape[d];
  KILN_CHECK(has_identity || count > 0,
             "{}: cannot reduce over no elements ({}, dims [{}]): {} has no identity", op,
             metas_str(in), fmt::join(dims, ","), op);
  return reduced_shape(x.shape, reduced, keepdim);
}

TensorMeta meta(std::span<const TensorMeta> in, Shape shape, DType dtype) {
  return TensorMeta{std::move(shape), dtype, in[0].device};
}

void check_floating(std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(is_floating(in[0].dtype), "{}: expects a floating tensor, got {}", op, metas_str(in));
}

// sum, prod: integer and bool inputs accumulate into i64, unless `dtype` says otherwise.
template <const char* op>
std::vector<TensorMeta> infer_sum_prod(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), op);
  const DType t = in[0].dtype;
  const DType out = a.has("dtype") ? a.dtype("dtype") : is_integral(t, true) ? DType::i64 : t;
  return {meta(in, std::move(shape), out)};
}
constexpr char kSumName[] = "sum";
constexpr char kProdName[] = "prod";
const OpDef& kSum = define_op({.name = "sum", .infer = infer_sum_prod<kSumName>, .reduction = Reduction::sum,
                                  .cast_policy = CastPolicy::f32});
const OpDef& kProd = define_op({.name = "prod", .infer = infer_sum_prod<kProdName>,
                                   .reduction = Reduction::other, .cast_policy = CastPolicy::f32});

std::vector<TensorMeta> infer_mean(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), "mean");
  if (a.has("dtype")) {
    const DType out = a.dtype("dtype");
    KILN_CHECK(is_floating(out), "mean: dtype must be floating, got {} ({})", out, metas_str(in));
    return {meta(in, std::move(shape), out)};
  }
  KILN_CHECK(is_floating(in[0].dtype),
             "mean: expects a floating tensor, got {}; pass a floating dtype to average integers",
             metas_str(in));
  return {meta(in, std::move(shape), in[0].dtype)};
}
const OpDef& kMean = define_op({.name = "mean", .infer = infer_mean, .reduction = Reduction::mean,
                                   .cast_policy = CastPolicy::f32});

// max, min: with a `dim` attribute, values and i64 indices along it; without, the one
// extreme element of the whole tensor.
template <const char* op>
std::vector<TensorMeta> infer_max_min(std::span<const TensorMeta> in, const Attrs& a) {
  if (!a.has("dim")) {
    Shape shape = reduce_shape(in, {}, false, op, false);
    return {meta(in, std::move(shape), in[0].dtype)};
  }
  Shape shape = reduce_shape(in, {a.i("dim")}, keepdim_attr(a), op, false);
  return {meta(in, shape, in[0].dtype), meta(in, shape, DType::i64)};
}
constexpr char kMaxName[] = "max";
constexpr char kMinName[] = "min";
const OpDef& kMax = define_op({.name = "max", .infer = infer_max_min<kMaxName>, .reduction = Reduction::other});
const OpDef& kMin = define_op({.name = "min", .infer = infer_max_min<kMinName>, .reduction = Reduction::other});

template <const char* op>
std::vector<TensorMeta> infer_amax_amin(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), op, false);
  return {meta(in, std::move(shape), in[0].dtype)};
}
constexpr char kAmaxName[] = "amax";
constexpr char kAminName[] = "amin";
const OpDef& kAmax = define_op({.name = "amax", .infer = infer_amax_amin<kAmaxName>, .reduction = Reduction::amax});
const OpDef& kAmin = define_op({.name = "amin", .infer = infer_amax_amin<kAminName>, .reduction = Reduction::amin});

// argmax, argmin: along `dim`, or over the flattened tensor when there is none.
template <const char* op>
std::vector<TensorMeta> infer_arg(std::span<const TensorMeta> in, const Attrs& a) {
  const DimList dims = a.has("dim") ? DimList{a.i("dim")} : DimList{};
  Shape shape = reduce_shape(in, dims, keepdim_attr(a), op, false);
  return {meta(in, std::move(shape), DType::i64)};
}
constexpr char kArgmaxName[] = "argmax";
constexpr char kArgminName[] = "argmin";
const OpDef& kArgmax = define_op({.name = "argmax", .infer = infer_arg<kArgmaxName>, .reduction = Reduction::other});
const OpDef& kArgmin = define_op({.name = "argmin", .infer = infer_arg<kArgminName>, .reduction = Reduction::other});

// var, std: floating inputs only; the result keeps the input's dtype.
template <const char* op>
std::vector<TensorMeta> infer_var_std(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), op);
  check_floating(in, op);
  return {meta(in, std::move(shape), in[0].dtype)};
}
constexpr char kVarName[] = "var";
constexpr char kStdName[] = "std";
const OpDef& kVar = define_op({.name = "var", .infer = infer_var_std<kVarName>, .reduction = Reduction::other,
                                  .cast_policy = CastPolicy::f32});
const OpDef& kStd = define_op({.name = "std", .infer = infer_var_std<kStdName>, .reduction = Reduction::other,
                                  .cast_policy = CastPolicy::f32});

std::vector<TensorMeta> infer_logsumexp(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), "logsumexp");
  const DType t = in[0].dtype;
  return {meta(in, std::move(shape), is_floating(t) ? t : kDefaultFloat)};
}
const OpDef& kLogsumexp = define_op({.name = "logsumexp", .infer = infer_logsumexp, .reduction = Reduction::other,
                                        .cast_policy = CastPolicy::f32});

template <const char* op>
std::vector<TensorMeta> infer_all_any(std::span<const TensorMeta> in, const Attrs& a) {
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), op);
  // As in PyTorch, u8 inputs give u8 (0 or 1); every other dtype gives bool.
  return {meta(in, std::move(shape), in[0].dtype == DType::u8 ? DType::u8 : DType::boolean)};
}
constexpr char kAllName[] = "all";
constexpr char kAnyName[] = "any";
const OpDef& kAll = define_op({.name = "all", .infer = infer_all_any<kAllName>, .reduction = Reduction::other});
const OpDef& kAny = define_op({.name = "any", .infer = infer_all_any<kAnyName>, .reduction = Reduction::other});

// norm: the infinite and negative norms have no identity, so they reject empty reductions.
std::vector<TensorMeta> infer_norm(std::span<const TensorMeta> in, const Attrs& a) {
  const double p = a.f("p");
  KILN_CHECK(!std::isnan(p), "norm: p must be a number, got nan ({})", metas_str(in));
  const bool has_identity = p >= 0 && !std::isinf(p);
  Shape shape = reduce_shape(in, dims_attr(a), keepdim_attr(a), "norm", has_identity);
  check_floating(in, "norm");
  return {meta(in, std::move(shape), in[0].dtype)};
}
const OpDef& kNorm = define_op({.name = "norm", .infer = infer_norm, .reduction = Reduction::other,
                                   .cast_policy = CastPolicy::f32});

Attrs dims_attrs(const DimList& dims, bool keepdim) {
  return {{"dims", dims}, {"keepdim", keepdim}};
}
Attrs dims_dtype_attrs(const DimList& dims, bool keepdim, std::optional<DType> dtype) {
  Attrs a = dims_attrs(dims, keepdim);
  if (dtype) a.set("dtype", *dtype);
  return a;
}
Attrs dim_attrs(std::optional<int64_t> dim, bool keepdim) {
  Attrs a{{"keepdim", keepdim}};
  if (dim) a.set("dim", *dim);
  return a;
}
ValuesIndices values_indices(std::vector<Tensor> outs) {
  return {std::move(outs.at(0)), std::move(outs.at(1))};
}

}  // namespace

Tensor sum(const Tensor& x, const DimList& dims, bool keepdim, std::optional<DType> dtype) {
  return call_op1(kSum, {x}, dims_dtype_attrs(dims, keepdim, dtype));
}
Tensor mean(const Tensor& x, const DimList& dims, bool keepdim, std::optional<DType> dtype) {
  return call_op1(kMean, {x}, dims_dtype_attrs(dims, keepdim, dtype));
}
Tensor prod(const Tensor& x, const DimList& dims, bool keepdim, std::optional<DType> dtype) {
  return call_op1(kProd, {x}, dims_dtype_attrs(dims, keepdim, dtype));
}

Tensor max(const Tensor& x) { return call_op1(kMax, {x}); }
Tensor min(const Tensor& x) { return call_op1(kMin, {x}); }
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return values_indices(call_op(kMax, {x}, dim_attrs(dim, keepdim)));
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return values_indices(call_op(kMin, {x}, dim_attrs(dim, keepdim)));
}
Tensor amax(const Tensor& x, const DimList& dims, bool keepdim) {
  return call_op1(kAmax, {x}, dims_attrs(dims, keepdim));
}
Tensor amin(const Tensor& x, const DimList& dims, bool keepdim) {
  return call_op1(kAmin, {x}, dims_attrs(dims, keepdim));
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return call_op1(kArgmax, {x}, dim_attrs(dim, keepdim));
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return call_op1(kArgmin, {x}, dim_attrs(dim, keepdim));
}

Tensor var(const Tensor& x, const DimList& dims, double correction, bool keepdim) {
  Attrs a = dims_attrs(dims, keepdim);
  a.set("correction", correction);
  return call_op1(kVar, {x}, a);
}
Tensor std(const Tensor& x, const DimList& dims, double correction, bool keepdim) {
  Attrs a = dims_attrs(dims, keepdim);
  a.set("correction", correction);
  return call_op1(kStd, {x}, a);
}
Tensor std_dev(const Tensor& x, const DimList& dims, double correction, bool keepdim) {
  return kiln::std(x, dims, correction, keepdim);
}
Tensor logsumexp(const Tensor& x, const DimList& dims, bool keepdim) {
  return call_op1(kLogsumexp, {x}, dims_attrs(dims, keepdim));
}
Tensor all(const Tensor& x, const DimList& dims, bool keepdim) {
  return call_op1(kAll, {x}, dims_attrs(dims, keepdim));
}
Tensor any(const Tensor& x, const DimList& dims, bool keepdim) {
  return call_op1(kAny, {x}, dims_attrs(dims, keepdim));
}
Tensor norm(const Tensor& x, double p, const DimList& dims, bool keepdim) {
  Attrs a{{"p", p}};
  a.set("dims", dims);
  a.set("keepdim", keepdim);
  return call_op1(kNorm, {x}, a);
}

}  // namespace kiln
