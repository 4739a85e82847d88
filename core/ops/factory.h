#pragma once
// Factories: new tensors from sizes, values, ranges, random streams or user memory.
#include <optional>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace kiln {

// Options of a new tensor: `zeros({2, 3}, {.dtype = DType::f64})`. Without a dtype,
// factories use f32 (arange and from_vector infer it from their values).
struct TensorOptions {
  std::optional<DType> dtype = std::nullopt;
  std::optional<Device> device = std::nullopt;  // cpu unless set (the _like forms: the tensor's)
  bool requires_grad = false;
};

Tensor empty(Shape shape, TensorOptions options = {});
Tensor zeros(Shape shape, TensorOptions options = {});
Tensor ones(Shape shape, TensorOptions options = {});
Tensor full(Shape shape, Scalar value, TensorOptions options = {});  // dtype from value if unset
Tensor arange(Scalar end, TensorOptions options = {});
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions options = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, TensorOptions options = {});

// Random factories draw from `generator` (the default one when null).
Tensor rand(Shape shape, TensorOptions options = {}, Generator* generator = nullptr);   // U[0,1)
Tensor randn(Shape shape, TensorOptions options = {}, Generator* generator = nullptr);  // N(0,1)
Tensor randint(int64_t low, int64_t high, Shape shape, TensorOptions options = {},
               Generator* generator = nullptr);  // [low, high), i64 by default
// In-place random fills.
Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* generator = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);

// A tensor holding a copy of `values`: of shape [values.size()], or of `shape` (Shape{} for
// a 0-d tensor of one value).
template <class T>
Tensor from_vector(const std::vector<T>& values, TensorOptions options = {});
template <class T>
Tensor from_vector(const std::vector<T>& values, Shape shape, TensorOptions options = {});
// A tensor over memory the caller owns and keeps alive (no copy). Strides default to
// contiguous.
Tensor from_blob(void* data, Shape shape, DType dtype, Shape strides = {});

Tensor empty_like(const Tensor& t, TensorOptions options = {});
Tensor zeros_like(const Tensor& t, TensorOptions options = {});
Tensor ones_like(const Tensor& t, TensorOptions options = {});
Tensor full_like(const Tensor& t, Scalar value, TensorOptions options = {});
Tensor rand_like(const Tensor& t, TensorOptions options = {}, Generator* generator = nullptr);
Tensor randn_like(const Tensor& t, TensorOptions options = {}, Generator* generator = nullptr);

}  // namespace kiln
