#pragma once
// Tensor: a handle to shared storage plus the view that reads it (shape, strides, offset),
// its dtype and device. Copying a Tensor copies the handle; views share storage.
// Op declarations live in core/ops/*.h, not here.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/scalar.h"
#include "core/storage.h"

namespace kiln {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2,3]"
int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); errors name `op`.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// How a 4-d [N, C, H, W] tensor's elements lie in memory: row-major (NCHW), or
// channels_last (NHWC: the channels of one pixel next to each other, then W, then H, then
// N), as PyTorch's torch.channels_last. The shape is [N, C, H, W] either way.
enum class MemoryFormat : uint8_t { contiguous, channels_last };
const char* memory_format_name(MemoryFormat f);  // "contiguous", "channels_last"
// The strides of a tensor of `shape` (4-d for channels_last) laid out in `format`.
Shape strides_for(const Shape& shape, MemoryFormat format);
// Whether channels_last lays out a tensor of `shape` differently from contiguous: 4-d with
// more than one channel and more than one pixel (else both are the same memory, and such a
// tensor counts as contiguous).
bool channels_last_differs(const Shape& shape);

struct AutogradMeta;  // defined by autograd/
class Node;           // a backward-graph node, defined by autograd/

struct TensorImpl {
  Storage storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  Device device;
  // A number written in the program (`x * 2`): lowest priority in type promotion.
  bool wrapped_number = false;
  bool requires_grad = false;
  std::shared_ptr<AutogradMeta> autograd;
  // For a tensor made by a view op: the tensor it views (never itself a view), so that
  // autograd can refuse in-place writes through views of tensors that require grad.
  std::shared_ptr<TensorImpl> view_base;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  // Metadata
  int64_t dim() const { return static_cast<int64_t>(get().shape.size()); }
  const Shape& shape() const { return get().shape; }
  const Shape& strides() const { return get().strides; }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const { return get().offset; }
  int64_t numel() const { return numel_of(get().shape); }
  DType dtype() const { return get().dtype; }
  Device device() const { return get().device; }
  size_t itemsize() const { return kiln::itemsize(get().dtype); }
  bool is_contiguous() const;
  // Whether the elements lie in memory as `format` lays them out (size-1 dims may have any
  // stride, as PyTorch's is_contiguous(memory_format)). A [N, C, 1, 1] tensor is both.
  bool is_contiguous(MemoryFormat format) const;
  // channels_last for a 4-d tensor laid out NHWC that is not also contiguous, else
  // contiguous: the layout kernels follow when they choose their output's layout.
  MemoryFormat suggest_memory_format() const;
  bool is_wrapped_number() const { return get().wrapped_number; }
  const Storage& storage() const { return get().storage; }
  // The first element's address (storage data + offset).
  void* data_ptr() const;
  template <class T> T* data_ptr() const {
    KILN_CHECK(dtype_v<T> == dtype(), "data_ptr: tensor has dtype {}, asked for {}", dtype(),
               dtype_v<T>);
    return static_cast<T*>(data_ptr());
  }
  std::string meta_str() const;  // "f32[2,3] cpu"

  // The single value of a one-element tensor.
  template <class T> T item() const;
  Scalar item() const;

  // Conversions and copies
  Tensor to(DType dtype) const;    // the same tensor when dtype already matches
  Tensor to(Device device) const;  // likewise
  Tensor clone() const;            // a contiguous copy
  Tensor contiguous() const;       // this tensor when already contiguous
  // This tensor when already laid out in `format`, else a copy that is (clone op).
  Tensor contiguous(MemoryFormat format) const;

  // Views: share storage, never copy (reshape and flatten copy only when no view exists).
  Tensor view(Shape shape) const;
  Tensor reshape(Shape shape) const;
  Tensor permute(std::vector<int64_t> dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose of a matrix (or a vector unchanged)
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(Shape shape) const;  // -1 keeps a size
  Tensor broadcast_to(Shape shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, Shape sizes) const;
  Tensor as_strided(Shape shape, Shape strides, int64_t offset) const;
  Tensor operator[](int64_t index) const { return select(0, index); }

  // In-place forms; each returns *this.
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& add_(Scalar other);
  Tensor& sub_(const Tensor& other, Scalar alpha = 1);
  Tensor& sub_(Scalar other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(Scalar other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(Scalar other);
  Tensor& fill_(Scalar value);
  Tensor& zero_();
  Tensor& copy_(const Tensor& src);  // broadcasts src and converts its dtype

  // Autograd (implemented in autograd/). Only floating tensors can require grad.
  bool requires_grad() const { return get().requires_grad; }
  Tensor& requires_grad_(bool on = true);  // leaves only
  bool is_leaf() const;                          // made by the user, not by an op on grad
  // The accumulated gradient: undefined until a backward pass reaches this leaf (or a
  // non-leaf that called retain_grad).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;  // undefined clears it
  std::shared_ptr<Node> grad_fn() const;    // null for leaves
  // Back-propagates from this tensor (a scalar, or with `gradient` of its shape),
  // accumulating into the .grad of every leaf that requires grad.
  void backward(const Tensor& gradient = {}, bool retain_graph = false,
                bool create_graph = false) const;
  // The same data, cut from the graph (shares storage, requires no grad).
  Tensor detach() const;
  void retain_grad() const;  // keep .grad for a non-leaf
  // hook(grad) runs when the gradient for this tensor is computed; a defined result
  // replaces the gradient. Returns a handle for remove_hook.
  int register_hook(std::function<Tensor(const Tensor&)> hook) const;
  void remove_hook(int handle) const;
  // hook(tensor) runs after a backward pass accumulated into this leaf's .grad.
  int register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;

  std::string str() const;  // PyTorch-like repr: tensor([[1., 2.], ...])

 private:
  // The impl, or a kiln::Error for an undefined tensor (a default-constructed one, or an
  // absent optional argument used as if present).
  const TensorImpl& get() const {
    if (!impl_) throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();

  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// A tensor over fresh storage (contiguous, or laid out in `format`) or over given storage.
Tensor make_tensor(Shape shape, DType dtype, Device device = Device::cpu());
Tensor make_tensor(Shape shape, DType dtype, Device device, MemoryFormat format);
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);
// A 0-d CPU tensor holding a number written in the program.
Tensor wrap_scalar(Scalar s);
// A 0-d tensor holding `s` converted to `dtype`.
Tensor scalar_tensor(Scalar s, DType dtype, Device device = Device::cpu());

// Whether a and b are the same view of the same storage (same offset, shape and strides):
// writing one element of a writes that element of b.
inline bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage() && a.offset() == b.offset() &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

// Bumps the version counter of t's storage: call after writing into t in place.
inline void bump_version(const Tensor& t) { ++t.storage()->version; }

}  // namespace kiln
