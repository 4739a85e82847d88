#include "core/ops/factory.h"

#include <cmath>

#include "core/registry.h"

namespace kiln {
namespace {

// Factory ops take no tensors; their attributes say what to make.
std::vector<TensorMeta> infer_factory(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.empty(), "factory: expects no tensor inputs");
  const Shape& shape = a.ints("shape");
  for (int64_t s : shape) KILN_CHECK(s >= 0, "factory: negative size in {}", shape_str(shape));
  return {TensorMeta{shape, a.dtype("dtype"), a.device("device")}};
}

const OpDef& kEmpty = define_op({.name = "empty", .infer = infer_factory});
const OpDef& kFull = define_op({.name = "full", .infer = infer_factory});
const OpDef& kArange = define_op({.name = "arange", .infer = infer_factory});
const OpDef& kLinspace = define_op({.name = "linspace", .infer = infer_factory});
const OpDef& kEye = define_op({.name = "eye", .infer = infer_factory});
const OpDef& kUniform = define_op({.name = "uniform", .infer = infer_factory, .random = true});
const OpDef& kNormal = define_op({.name = "normal", .infer = infer_factory, .random = true});
const OpDef& kRandint = define_op({.name = "randint", .infer = infer_factory, .random = true});

Attrs base_attrs(const Shape& shape, DType dtype, Device device) {
  return {{"shape", shape}, {"dtype", dtype}, {"device", device}};
}

Tensor finish(Tensor t, const TensorOptions& o) {
  t.impl()->requires_grad = o.requires_grad;
  return t;
}

Attrs random_attrs(const Shape& shape, DType dtype, Device device, Generator* g) {
  Generator& gen = g ? *g : default_generator();
  Attrs a = base_attrs(shape, dtype, device);
  const Generator::Reservation r = gen.reserve(static_cast<uint64_t>(numel_of(shape)));
  a.set("seed", static_cast<int64_t>(r.seed));
  a.set("offset", static_cast<int64_t>(r.offset));
  return a;
}

}  // namespace

Tensor empty(Shape shape, TensorOptions o) {
  return finish(call_op1(kEmpty, {}, base_attrs(shape, o.dtype.value_or(kDefaultFloat), o.device.value_or(Device::cpu()))), o);
}
Tensor full(Shape shape, Scalar value, TensorOptions o) {
  const DType dtype = o.dtype.value_or(value.is_floating() ? kDefaultFloat : value.kind());
  Attrs a = base_attrs(shape, dtype, o.device.value_or(Device::cpu()));
  a.set("value", value);
  return finish(call_op1(kFull, {}, a), o);
}
Tensor zeros(Shape shape, TensorOptions o) {
  o.dtype = o.dtype.value_or(kDefaultFloat);
  return full(std::move(shape), 0, o);
}
Tensor ones(Shape shape, TensorOptions o) {
  o.dtype = o.dtype.value_or(kDefaultFloat);
  return full(std::move(shape), 1, o);
}

Tensor arange(Scalar end, TensorOptions o) { return arange(0, end, 1, o); }
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions o) {
  const bool floating = start.is_floating() || end.is_floating() || step.is_floating();
  const DType dtype = o.dtype.value_or(floating ? kDefaultFloat : DType::i64);
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  KILN_CHECK(std::isfinite(s) && std::isfinite(e) && std::isfinite(st),
             "arange: start {}, end {} and step {} must be finite", s, e, st);
  KILN_CHECK(st != 0, "arange: step must be nonzero");
  KILN_CHECK((st > 0 && e >= s) || (st < 0 && e <= s),
             "arange: upper bound {} and step {} are inconsistent with start {}", e, st, s);
  const int64_t n = static_cast<int64_t>(std::ceil((e - s) / st));
  Attrs a = base_attrs({n}, dtype, o.device.value_or(Device::cpu()));
  a.set("start", start);
  a.set("step", step);
  return finish(call_op1(kArange, {}, a), o);
}
Tensor linspace(double start, double end, int64_t steps, TensorOptions o) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got {}", steps);
  Attrs a = base_attrs({steps}, o.dtype.value_or(kDefaultFloat), o.device.value_or(Device::cpu()));
  a.set("start", start);
  a.set("end", end);
  return finish(call_op1(kLinspace, {}, a), o);
}
Tensor eye(int64_t n, std::optional<int64_t> m, TensorOptions o) {
  KILN_CHECK(n >= 0 && m.value_or(0) >= 0, "eye: sizes must be non-negative, got {} and {}", n,
             m.value_or(n));
  return finish(call_op1(kEye, {}, base_attrs({n, m.value_or(n)}, o.dtype.value_or(kDefaultFloat), o.device.value_or(Device::cpu()))), o);
}

Tensor rand(Shape shape, TensorOptions o, Generator* g) {
  const DType dtype = o.dtype.value_or(kDefaultFloat);
  KILN_CHECK(is_floating(dtype), "rand: dtype must be floating, got {}", dtype);
  Attrs a = random_attrs(shape, dtype, o.device.value_or(Device::cpu()), g);
  a.set("low", 0.0);
  a.set("high", 1.0);
  return finish(call_op1(kUniform, {}, a), o);
}
Tensor randn(Shape shape, TensorOptions o, Generator* g) {
  const DType dtype = o.dtype.value_or(kDefaultFloat);
  KILN_CHECK(is_floating(dtype), "randn: dtype must be floating, got {}", dtype);
  Attrs a = random_attrs(shape, dtype, o.device.value_or(Device::cpu()), g);
  a.set("mean", 0.0);
  a.set("std", 1.0);
  return finish(call_op1(kNormal, {}, a), o);
}
Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions o, Generator* g) {
  KILN_CHECK(low < high, "randint: low {} must be less than high {}", low, high);
  Attrs a = random_attrs(shape, o.dtype.value_or(DType::i64), o.device.value_or(Device::cpu()), g);
  a.set("low", low);
  a.set("high", high);
  return finish(call_op1(kRandint, {}, a), o);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* g) {
  KILN_CHECK(is_floating(t.dtype()), "uniform_: dtype must be floating, got {}", t.meta_str());
  Attrs a = random_attrs(t.shape(), t.dtype(), t.device(), g);
  a.set("low", low);
  a.set("high", high);
  return t.copy_(call_op1(kUniform, {}, a));
}
Tensor& normal_(Tensor& t, double mean, double std, Generator* g) {
  KILN_CHECK(is_floating(t.dtype()), "normal_: dtype must be floating, got {}", t.meta_str());
  Attrs a = random_attrs(t.shape(), t.dtype(), t.device(), g);
  a.set("mean", mean);
  a.set("std", std);
  return t.copy_(call_op1(kNormal, {}, a));
}

template <class T>
Tensor from_vector(const std::vector<T>& values, Shape shape, TensorOptions o) {
  KILN_CHECK(numel_of(shape) == static_cast<int64_t>(values.size()),
             "from_vector: {} values do not fill shape {}", values.size(), shape_str(shape));
  Tensor t = make_tensor(shape, dtype_v<T>);
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = static_cast<bool*>(t.data_ptr());
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  }
  if (o.dtype) t = t.to(*o.dtype);
  t = t.to(o.device.value_or(Device::cpu()));
  return finish(t, o);
}
template <class T>
Tensor from_vector(const std::vector<T>& values, TensorOptions o) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())}, o);
}
template Tensor from_vector(const std::vector<float>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<float>&, TensorOptions);
template Tensor from_vector(const std::vector<double>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<double>&, TensorOptions);
template Tensor from_vector(const std::vector<Half>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<Half>&, TensorOptions);
template Tensor from_vector(const std::vector<BFloat16>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<BFloat16>&, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, TensorOptions);
template Tensor from_vector(const std::vector<uint8_t>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<uint8_t>&, TensorOptions);
template Tensor from_vector(const std::vector<bool>&, Shape, TensorOptions);
template Tensor from_vector(const std::vector<bool>&, TensorOptions);

Tensor from_blob(void* data, Shape shape, DType dtype, Shape strides) {
  KILN_CHECK(data || numel_of(shape) == 0, "from_blob: data is null for shape {}", shape_str(shape));
  if (strides.empty()) strides = contiguous_strides(shape);
  KILN_CHECK(strides.size() == shape.size(), "from_blob: shape {} and strides {} differ in length",
             shape_str(shape), shape_str(strides));
  for (size_t i = 0; i < shape.size(); ++i)
    KILN_CHECK(shape[i] >= 0 && strides[i] >= 0,
               "from_blob: sizes and strides must be non-negative, got shape {} strides {}",
               shape_str(shape), shape_str(strides));
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) extent += (shape[i] - 1) * strides[i];
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(
      data, static_cast<size_t>(std::max<int64_t>(extent, 0)) * itemsize(dtype), Device::cpu(), nullptr);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

static TensorOptions like(const Tensor& t, TensorOptions o) {
  if (!o.dtype) o.dtype = t.dtype();
  if (!o.device) o.device = t.device();
  return o;
}
Tensor empty_like(const Tensor& t, TensorOptions o) {
  o = like(t, o);
  return empty(t.shape(), o);
}
Tensor zeros_like(const Tensor& t, TensorOptions o) { return full_like(t, 0, o); }
Tensor ones_like(const Tensor& t, TensorOptions o) { return full_like(t, 1, o); }
Tensor full_like(const Tensor& t, Scalar value, TensorOptions o) {
  o = like(t, o);
  return full(t.shape(), value, o);
}
Tensor rand_like(const Tensor& t, TensorOptions o, Generator* g) {
  o = like(t, o);
  return rand(t.shape(), o, g);
}
Tensor randn_like(const Tensor& t, TensorOptions o, Generator* g) {
  o = like(t, o);
  return randn(t.shape(), o, g);
}

}  // namespace kiln
