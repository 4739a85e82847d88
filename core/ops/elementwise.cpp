// Elementwise ops: their shape and dtype rules and their public functions.
#include "core/ops/elementwise.h"

#include "core/ops/elementwise_table.h"
#include "core/registry.h"

namespace kiln {
namespace {

TensorMeta out_meta(std::span<const TensorMeta> in, const char* op, DType dtype) {
  std::vector<Shape> shapes;
  for (const TensorMeta& m : in)
    if (m.defined) shapes.push_back(m.shape);
  TensorMeta out{broadcast_shapes(shapes, op), dtype, common_device(in, op)};
  out.memory_format = elementwise_memory_format(in, out.shape);
  return out;
}

void check_inputs(std::span<const TensorMeta> in, size_t n, const char* op) {
  KILN_CHECK(in.size() == n, "{}: expects {} tensors, got {}", op, n, in.size());
  for (const TensorMeta& m : in) KILN_CHECK(m.defined, "{}: an input is undefined", op);
}

// The rules, parameterised by how the output dtype follows the inputs' result type.
enum class Rule { same, floating, boolean, no_bool };

template <Rule rule, size_t arity>
std::vector<TensorMeta> infer(const char* op, std::span<const TensorMeta> in) {
  check_inputs(in, arity, op);
  DType t = result_type(in);
  if constexpr (rule == Rule::floating) t = is_floating(t) ? t : kDefaultFloat;
  if constexpr (rule == Rule::boolean) t = DType::boolean;
  if constexpr (rule == Rule::no_bool)
    KILN_CHECK(t != DType::boolean, "{}: bool tensors are not supported ({})", op, metas_str(in));
  return {out_meta(in, op, t)};
}

// The ops of the table (core/ops/elementwise_table.h): the rule follows the category.
constexpr Rule rule_of(Elementwise category, bool bools) {
  if (category == Elementwise::compare || category == Elementwise::logical) return Rule::boolean;
  if (category == Elementwise::floating) return Rule::floating;
  return bools ? Rule::same : Rule::no_bool;
}
constexpr bool bools_any = true, bools_no_bool = false;

#define KILN_DEFINE_SCALAR_OP(op, category, arity, bools, policy)                             \
  std::vector<TensorMeta> infer_##op(std::span<const TensorMeta> in, const Attrs&) {           \
    return infer<rule_of(Elementwise::category, bools_##bools), arity>(#op, in);               \
  }                                                                                            \
  const OpDef& op_##op = define_op({.name = #op, .infer = infer_##op,                          \
                                    .elementwise = Elementwise::category,                      \
                                    .cast_policy = CastPolicy::policy});
KILN_SCALAR_OPS(KILN_DEFINE_SCALAR_OP)
#undef KILN_DEFINE_SCALAR_OP

// gelu and softplus: floating functions of the input and their attributes.
std::vector<TensorMeta> infer_gelu(std::span<const TensorMeta> in, const Attrs&) {
  return infer<Rule::floating, 1>("gelu", in);
}
std::vector<Scalar> gelu_args(const Attrs& a) { return {Scalar(a.str("approximate") == "tanh")}; }
const OpDef& op_gelu = define_op({.name = "gelu", .infer = infer_gelu, .elementwise = Elementwise::floating,
                                  .scalar_args = gelu_args});
// gelu_backward(grad, x): grad times gelu's slope, broadcast and promoted as a binary op.
std::vector<TensorMeta> infer_gelu_backward(std::span<const TensorMeta> in, const Attrs&) {
  return infer<Rule::floating, 2>("gelu_backward", in);
}
const OpDef& op_gelu_backward =
    define_op({.name = "gelu_backward", .infer = infer_gelu_backward, .elementwise = Elementwise::floating,
               .scalar_args = gelu_args, .cast_policy = CastPolicy::promote});
std::vector<TensorMeta> infer_softplus(std::span<const TensorMeta> in, const Attrs&) {
  return infer<Rule::floating, 1>("softplus", in);
}
std::vector<Scalar> softplus_args(const Attrs& a) { return {Scalar(a.f("beta")), Scalar(a.f("threshold"))}; }
const OpDef& op_softplus =
    define_op({.name = "softplus", .infer = infer_softplus, .elementwise = Elementwise::floating,
               .scalar_args = softplus_args, .cast_policy = CastPolicy::f32});

// clamp: the bounds are attributes; they take part in type promotion as numbers do.
std::vector<TensorMeta> infer_clamp(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "clamp");
  KILN_CHECK(a.has("min") || a.has("max"), "clamp: at least one of min and max must be given ({})",
             metas_str(in));
  std::vector<TensorMeta> all(in.begin(), in.end());
  for (const char* bound : {"min", "max"})
    if (auto s = a.optional_scalar(bound))
      all.push_back(TensorMeta{{}, s->kind(), Device::cpu(), true});
  const DType t = result_type(all);
  KILN_CHECK(t != DType::boolean, "clamp: bool tensors are not supported ({})", metas_str(in));
  return {TensorMeta{in[0].shape, t, in[0].device}};
}
const OpDef& kClamp = define_op({.name = "clamp", .infer = infer_clamp, .elementwise = Elementwise::clamp});

// where(cond, a, b): cond must be bool; a and b promote.
std::vector<TensorMeta> infer_where(std::span<const TensorMeta> in, const Attrs&) {
  check_inputs(in, 3, "where");
  KILN_CHECK(in[0].dtype == DType::boolean, "where: the condition must be bool, got {}",
             metas_str(in));
  TensorMeta m = out_meta(in, "where", result_type(in.subspan(1)));
  return {m};
}
const OpDef& kWhere = define_op({.name = "where", .infer = infer_where, .elementwise = Elementwise::select,
                                 .cast_policy = CastPolicy::promote});

// cast: a copy converted to the `dtype` attribute, laid out as the input; clone: a
// contiguous copy, or one laid out channels_last with {channels_last=true}.
std::vector<TensorMeta> infer_cast(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "cast");
  TensorMeta out{in[0].shape, a.dtype("dtype"), in[0].device};
  out.memory_format = in[0].memory_format;
  return {out};
}
const OpDef& kCast = define_op({.name = "cast", .infer = infer_cast, .elementwise = Elementwise::convert});
std::vector<TensorMeta> infer_clone(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "clone");
  TensorMeta out{in[0].shape, in[0].dtype, in[0].device};
  if (a.has("channels_last") && a.b("channels_last")) {
    KILN_CHECK(in[0].shape.size() == 4, "clone: channels_last needs a 4-d [N, C, H, W] tensor, got {}",
               metas_str(in));
    out.memory_format = MemoryFormat::channels_last;
  }
  return {out};
}
const OpDef& kClone = define_op({.name = "clone", .infer = infer_clone, .elementwise = Elementwise::convert});
// fill: a tensor shaped like the input, every element `value` (used in place by fill_).
std::vector<TensorMeta> infer_fill(std::span<const TensorMeta> in, const Attrs&) {
  check_inputs(in, 1, "fill");
  return {TensorMeta{in[0].shape, in[0].dtype, in[0].device}};
}
const OpDef& kFill = define_op({.name = "fill", .infer = infer_fill, .elementwise = Elementwise::fill});
// to_device: a copy on another device.
std::vector<TensorMeta> infer_to_device(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "to_device");
  return {TensorMeta{in[0].shape, in[0].dtype, a.device("device")}};
}
const OpDef& kToDevice = define_op({.name = "to_device", .infer = infer_to_device, .elementwise = Elementwise::opaque});

// add and sub: a floating alpha cannot scale an integer result (PyTorch's rule).
template <Rule rule>
std::vector<TensorMeta> infer_add_sub(const char* op, std::span<const TensorMeta> in, const Attrs& a) {
  std::vector<TensorMeta> out = infer<rule, 2>(op, in);
  if (auto alpha = a.optional_scalar("alpha"))
    KILN_CHECK(!alpha->is_floating() || is_floating(out[0].dtype),
               "{}: alpha {} is a floating number but the result is {} ({})", op,
               alpha->to_double(), out[0].dtype, metas_str(in));
  return out;
}

std::vector<TensorMeta> infer_add(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_add_sub<Rule::same>("add", in, a);
}
std::vector<TensorMeta> infer_sub(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_add_sub<Rule::no_bool>("sub", in, a);
}
const OpDef& kAdd = define_op({.name = "add", .infer = infer_add, .elementwise = Elementwise::same,
                                .cast_policy = CastPolicy::promote});
const OpDef& kSub = define_op({.name = "sub", .infer = infer_sub, .elementwise = Elementwise::same,
                                .cast_policy = CastPolicy::promote});

Tensor unary(const OpDef& op, const Tensor& x, const Attrs& attrs = {}) {
  return call_op1(op, {x}, attrs);
}
Tensor binary(const OpDef& op, const Tensor& a, const Tensor& b, const Attrs& attrs = {}) {
  return call_op1(op, {a, b}, attrs);
}
Tensor& inplace(const OpDef& op, Tensor& x, std::vector<Tensor> inputs, const Attrs& attrs = {}) {
  call_op_out(op, std::move(inputs), attrs, x);
  return x;
}
Attrs alpha_attrs(Scalar alpha) {
  if (alpha.kind() != DType::f64 && alpha.to_int() == 1) return {};
  return {{"alpha", alpha}};
}


}  // namespace

Tensor neg(const Tensor& x) { return unary(op_neg, x); }
Tensor abs(const Tensor& x) { return unary(op_abs, x); }
Tensor sign(const Tensor& x) { return unary(op_sign, x); }
Tensor exp(const Tensor& x) { return unary(op_exp, x); }
Tensor log(const Tensor& x) { return unary(op_log, x); }
Tensor log1p(const Tensor& x) { return unary(op_log1p, x); }
Tensor expm1(const Tensor& x) { return unary(op_expm1, x); }
Tensor sqrt(const Tensor& x) { return unary(op_sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(op_rsqrt, x); }
Tensor reciprocal(const Tensor& x) { return unary(op_reciprocal, x); }
Tensor sin(const Tensor& x) { return unary(op_sin, x); }
Tensor cos(const Tensor& x) { return unary(op_cos, x); }
Tensor tanh(const Tensor& x) { return unary(op_tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(op_sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(op_relu, x); }
Tensor gelu(const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  return unary(op_gelu, x, {{"approximate", approximate}});
}
Tensor gelu_backward(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "gelu_backward: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  return binary(op_gelu_backward, grad, x, {{"approximate", approximate}});
}
Tensor silu(const Tensor& x) { return unary(op_silu, x); }
Tensor softplus(const Tensor& x, double beta, double threshold) {
  return unary(op_softplus, x, {{"beta", beta}, {"threshold", threshold}});
}
Tensor logical_not(const Tensor& x) { return unary(op_logical_not, x); }

static Attrs clamp_attrs(std::optional<Scalar> min, std::optional<Scalar> max) {
  Attrs a;
  if (min) a.set("min", *min);
  if (max) a.set("max", *max);
  return a;
}
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  return unary(kClamp, x, clamp_attrs(min, max));
}
Tensor clamp_min(const Tensor& x, Scalar min) { return clamp(x, min, std::nullopt); }
Tensor clamp_max(const Tensor& x, Scalar max) { return clamp(x, std::nullopt, max); }

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary(kAdd, a, b, alpha_attrs(alpha));
}
Tensor add(const Tensor& a, Scalar b) { return binary(kAdd, a, wrap_scalar(b)); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary(kSub, a, b, alpha_attrs(alpha));
}
Tensor sub(const Tensor& a, Scalar b) { return binary(kSub, a, wrap_scalar(b)); }
Tensor operator-(Scalar a, const Tensor& b) { return binary(kSub, wrap_scalar(a), b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(op_mul, a, b); }
Tensor mul(const Tensor& a, Scalar b) { return binary(op_mul, a, wrap_scalar(b)); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(op_div, a, b); }
Tensor div(const Tensor& a, Scalar b) { return binary(op_div, a, wrap_scalar(b)); }
Tensor operator/(Scalar a, const Tensor& b) { return binary(op_div, wrap_scalar(a), b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(op_pow, a, b); }
Tensor pow(const Tensor& a, Scalar b) {
  KILN_CHECK(b.is_floating() || b.to_int() >= 0 || is_floating(a.dtype()),
             "pow: integers to negative integer powers are not allowed ({} ** {})", a.meta_str(),
             b.to_int());
  return binary(op_pow, a, wrap_scalar(b));
}
Tensor pow(Scalar a, const Tensor& b) { return binary(op_pow, wrap_scalar(a), b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(op_maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(op_minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(op_eq, a, b); }
Tensor eq(const Tensor& a, Scalar b) { return binary(op_eq, a, wrap_scalar(b)); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(op_ne, a, b); }
Tensor ne(const Tensor& a, Scalar b) { return binary(op_ne, a, wrap_scalar(b)); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(op_lt, a, b); }
Tensor lt(const Tensor& a, Scalar b) { return binary(op_lt, a, wrap_scalar(b)); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(op_le, a, b); }
Tensor le(const Tensor& a, Scalar b) { return binary(op_le, a, wrap_scalar(b)); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(op_gt, a, b); }
Tensor gt(const Tensor& a, Scalar b) { return binary(op_gt, a, wrap_scalar(b)); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(op_ge, a, b); }
Tensor ge(const Tensor& a, Scalar b) { return binary(op_ge, a, wrap_scalar(b)); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary(op_logical_and, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary(op_logical_or, a, b); }
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return call_op1(kWhere, {cond, a, b});
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return call_op1(kWhere, {cond, a, wrap_scalar(b)});
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return call_op1(kWhere, {cond, wrap_scalar(a), b});
}

Tensor& neg_(Tensor& x) { return inplace(op_neg, x, {x}); }
Tensor& exp_(Tensor& x) { return inplace(op_exp, x, {x}); }
Tensor& sqrt_(Tensor& x) { return inplace(op_sqrt, x, {x}); }
Tensor& tanh_(Tensor& x) { return inplace(op_tanh, x, {x}); }
Tensor& sigmoid_(Tensor& x) { return inplace(op_sigmoid, x, {x}); }
Tensor& relu_(Tensor& x) { return inplace(op_relu, x, {x}); }
Tensor& clamp_(Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  return inplace(kClamp, x, {x}, clamp_attrs(min, max));
}
Tensor& pow_(Tensor& x, Scalar exponent) { return inplace(op_pow, x, {x, wrap_scalar(exponent)}); }

// ---- Tensor members ----

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  call_op_out(kAdd, {*this, other}, alpha_attrs(alpha), *this);
  return *this;
}
Tensor& Tensor::add_(Scalar other) {
  call_op_out(kAdd, {*this, wrap_scalar(other)}, {}, *this);
  return *this;
}
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  call_op_out(kSub, {*this, other}, alpha_attrs(alpha), *this);
  return *this;
}
Tensor& Tensor::sub_(Scalar other) {
  call_op_out(kSub, {*this, wrap_scalar(other)}, {}, *this);
  return *this;
}
Tensor& Tensor::mul_(const Tensor& other) {
  call_op_out(op_mul, {*this, other}, {}, *this);
  return *this;
}
Tensor& Tensor::mul_(Scalar other) {
  call_op_out(op_mul, {*this, wrap_scalar(other)}, {}, *this);
  return *this;
}
Tensor& Tensor::div_(const Tensor& other) {
  call_op_out(op_div, {*this, other}, {}, *this);
  return *this;
}
Tensor& Tensor::div_(Scalar other) {
  call_op_out(op_div, {*this, wrap_scalar(other)}, {}, *this);
  return *this;
}
Tensor& Tensor::fill_(Scalar value) {
  call_op_out(kFill, {*this}, {{"value", value}}, *this);
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }
Tensor& Tensor::copy_(const Tensor& src) {
  KILN_CHECK(src.defined(), "copy_: the source is undefined");
  if (src.device() != device()) {
    // Move first, then convert and broadcast on the target device.
    return copy_(src.to(device()));
  }
  if (src.shape() != shape()) {
    const Shape shapes[] = {shape(), src.shape()};
    KILN_CHECK(broadcast_shapes(shapes, "copy_") == shape(),
               "copy_: the source {} does not broadcast to the target {}", src.meta_str(), meta_str());
  }
  Tensor s = src.shape() == shape() ? src : src.expand(shape());
  call_op_out(kCast, {s}, {{"dtype", dtype()}}, *this);
  return *this;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  return call_op1(kCast, {*this}, {{"dtype", dtype}});
}
Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  return call_op1(kToDevice, {*this}, {{"device", device}});
}
Tensor Tensor::clone() const { return call_op1(kClone, {*this}); }
Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }
Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::contiguous) return contiguous();
  if (is_contiguous(format)) return *this;
  return call_op1(kClone, {*this}, Attrs{{"channels_last", true}});
}

}  // namespace kiln
