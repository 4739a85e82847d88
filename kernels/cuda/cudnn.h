#pragma once
// What the cuDNN-backed kernels (conv.cpp, norm.cpp, pool.cpp) share: a handle per device
// bound to the device's current stream, error checking that names the op, RAII
// descriptors, workspaces from the caching allocator and the dtype mapping. Built only
// when CMake finds cuDNN (KILN_HAVE_CUDNN).
#include <cudnn.h>

#include <cstdint>
#include <span>

#include "core/ops/factory.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda::dnn {

// Throws kiln::Error "<op>: cuDNN failed: <cudnnGetErrorString> (<code>)" unless s is success.
void check(cudnnStatus_t s, const char* op);

// The handle of `device`, created on first use and bound to its current stream at each
// call. The caller makes `device` current (DeviceGuard).
cudnnHandle_t handle_for(int device, const char* op);

// The cuDNN data type of a tensor's dtype (f32, f64, f16, bf16; else a kiln::Error).
cudnnDataType_t data_type(DType t, const char* op);
// The type cuDNN computes in for tensors of dtype t: f64 for f64, f32 otherwise.
cudnnDataType_t compute_type(DType t);

// Scaling factors cuDNN reads through void pointers: double for f64 data, float otherwise.
struct Scale {
  float f;
  double d;
  explicit Scale(double v) : f(static_cast<float>(v)), d(v) {}
  const void* for_type(DType t) const { return t == DType::f64 ? static_cast<const void*>(&d) : &f; }
};

class TensorDesc {
 public:
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // Sizes and strides in elements (4 dims or more), as cuDNN's Nd descriptor takes them.
  void set(DType dtype, std::span<const int64_t> sizes, std::span<const int64_t> strides, const char* op);
  // A 4-d tensor's own sizes and strides.
  void set(const Tensor& t, const char* op) { set(t.dtype(), t.shape(), t.strides(), op); }
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc();
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  // A [O, C/groups, kh, kw] weight stored NCHW (contiguous) or NHWC (channels_last).
  void set(DType dtype, const Shape& shape, bool channels_last, const char* op);
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc();
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

class PoolDesc {
 public:
  PoolDesc();
  ~PoolDesc();
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return desc_; }

 private:
  cudnnPoolingDescriptor_t desc_ = nullptr;
};

// A workspace of at least `bytes` on `device` from the caching allocator (an empty u8
// tensor: it goes back to the cache when the last reference dies, after the work queued
// on the stream, which is the allocator's stream order).
Tensor workspace(int64_t bytes, Device device);

// How many timed algorithm searches (cudnnFind*AlgorithmEx, in benchmark mode) the
// convolutions have run since the process started: one per direction and call shape; the
// tests read it to see that a shape is searched once.
int64_t cudnn_algorithm_searches();

// Whether t's strides are those of a contiguous tensor of t's shape in the NHWC order
// (channels_last), for a 4-d t. Size-1 dims may have any stride.
bool is_channels_last(const Tensor& t);
// A [N, C, H, W] tensor of `dtype` on `device` whose memory is NHWC-ordered.
Tensor empty_channels_last(const Shape& shape, DType dtype, Device device);
// Returns t itself when its memory is contiguous NCHW (channels_last false) or NHWC
// (channels_last true), else a copy in that order.
Tensor in_layout(const Tensor& t, bool channels_last);

// Runs f(o) into `out` directly when its memory is in the asked layout (and dtype `dtype`),
// else into a temporary copied (and converted) into `out` afterwards.
template <class F>
void into_layout(const Tensor& out, bool channels_last, DType dtype, F&& f) {
  const bool fits = out.dtype() == dtype && (channels_last ? is_channels_last(out) : out.is_contiguous());
  if (fits) return f(out);
  Tensor tmp = channels_last ? empty_channels_last(out.shape(), dtype, out.device())
                             : empty(out.shape(), {.dtype = dtype, .device = out.device()});
  f(tmp);
  Tensor(out).copy_(tmp);
}

}  // namespace kiln::cuda::dnn
