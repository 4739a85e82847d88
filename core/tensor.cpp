#include "core/tensor.h"

#include "core/registry.h"

#include <ostream>

#include <fmt/ranges.h>

namespace kiln {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s)
    if (__builtin_mul_overflow(n, v, &n))
      fail("shape {} has more elements than an int64 can count", shape_str(s));
  return n;
}

void Tensor::throw_undefined() {
  fail("Tensor: the tensor is undefined (default-constructed, or an absent optional argument)");
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t st = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = st;
    st *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  KILN_CHECK(dim >= -n && dim < n, "{}: dim {} is out of range for a tensor of {} dims", op, dim,
             ndim);
  return dim < 0 ? dim + n : dim;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as in PyTorch: nothing to lay out
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::contiguous) return is_contiguous();
  if (dim() != 4) return false;
  if (numel() == 0) return true;
  // strides_for's NHWC strides, without a Shape per call: every op's inputs ask this.
  const Shape& s = impl_->shape;
  const int64_t want[4] = {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  for (int64_t d = 0; d < 4; ++d)
    if (s[d] != 1 && impl_->strides[d] != want[d]) return false;
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  return is_contiguous(MemoryFormat::channels_last) && !is_contiguous() ? MemoryFormat::channels_last
                                                                        : MemoryFormat::contiguous;
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

Shape strides_for(const Shape& shape, MemoryFormat format) {
  if (format == MemoryFormat::contiguous) return contiguous_strides(shape);
  KILN_CHECK(shape.size() == 4, "channels_last: needs a 4-d [N, C, H, W] shape, got {}", shape_str(shape));
  const int64_t c = shape[1], h = shape[2], w = shape[3];
  return {h * w * c, 1, w * c, c};
}

bool channels_last_differs(const Shape& shape) {
  return shape.size() == 4 && shape[1] != 1 && shape[2] * shape[3] != 1;
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = get();
  if (is_pending(*t.storage)) compute_pending(*t.storage);
  return static_cast<char*>(t.storage->data) + t.offset * itemsize();
}

std::string Tensor::meta_str() const {
  if (!defined()) return "undefined";
  return fmt::format("{}{} {}", dtype(), shape_str(shape()), device());
}

Tensor make_tensor(Shape shape, DType dtype, Device device, MemoryFormat format) {
  Tensor t = make_tensor(shape, dtype, device);
  if (format != MemoryFormat::contiguous) t.impl()->strides = strides_for(t.shape(), format);
  return t;
}

Tensor make_tensor(Shape shape, DType dtype, Device device) {
  for (int64_t s : shape)
    KILN_CHECK(s >= 0, "empty: negative size in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  size_t nbytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(static_cast<size_t>(numel_of(shape)), itemsize(dtype), &nbytes),
             "empty: a {} tensor of shape {} needs more bytes than memory can address", dtype,
             shape_str(shape));
  impl->storage = allocate_storage(nbytes, device);
  impl->strides = contiguous_strides(shape);
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

Tensor scalar_tensor(Scalar s, DType dtype, Device device) {
  Tensor t = make_tensor({}, dtype, Device::cpu());
  visit_dtype(dtype, [&]<class T>() { *static_cast<T*>(t.data_ptr()) = s.to<T>(); });
  return device.is_cpu() ? t : t.to(device);
}

Tensor wrap_scalar(Scalar s) {
  Tensor t = scalar_tensor(s, s.kind());
  t.impl()->wrapped_number = true;
  return t;
}

template <class T>
T Tensor::item() const {
  KILN_CHECK(defined(), "item: tensor is undefined");
  KILN_CHECK(numel() == 1, "item: a tensor with {} elements ({}) cannot be converted to a scalar",
             numel(), meta_str());
  report_host_read(*this, "item");
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  return visit_dtype(c.dtype(), [&]<class S>() -> T {
    const S v = *static_cast<const S*>(c.data_ptr());
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      return static_cast<T>(static_cast<float>(v));
    else return static_cast<T>(v);
  });
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template uint8_t Tensor::item<uint8_t>() const;
template bool Tensor::item<bool>() const;
template <> Half Tensor::item<Half>() const { return Half(item<float>()); }
template <> BFloat16 Tensor::item<BFloat16>() const { return BFloat16(item<float>()); }

Scalar Tensor::item() const {
  if (is_floating(dtype())) return Scalar(item<double>());
  if (dtype() == DType::boolean) return Scalar(item<bool>());
  return Scalar(item<int64_t>());
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
