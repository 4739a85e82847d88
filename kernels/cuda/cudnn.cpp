// The cuDNN plumbing shared by the convolution, batch-norm and pooling kernels.
#include "kernels/cuda/cudnn.h"

#include <array>
#include <mutex>
#include <vector>

namespace kiln::cuda::dnn {

void check(cudnnStatus_t s, const char* op) {
  KILN_CHECK(s == CUDNN_STATUS_SUCCESS, "{}: cuDNN failed: {} ({})", op, cudnnGetErrorString(s),
             static_cast<int>(s));
}

cudnnHandle_t handle_for(int device, const char* op) {
  static std::array<cudnnHandle_t, 64> handles{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  cudnnHandle_t& h = handles.at(static_cast<size_t>(device));
  if (!h) check(cudnnCreate(&h), op);
  // Rebound at every call: a StreamGuard may have swapped the device's current stream.
  check(cudnnSetStream(h, stream_of(device)), op);
  return h;
}

cudnnDataType_t data_type(DType t, const char* op) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: fail("{}: dtype {} is not supported by cuDNN (floating dtypes only)", op, t);
  }
}

cudnnDataType_t compute_type(DType t) { return t == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

TensorDesc::TensorDesc() { check(cudnnCreateTensorDescriptor(&desc_), "cudnnCreateTensorDescriptor"); }
TensorDesc::~TensorDesc() { cudnnDestroyTensorDescriptor(desc_); }

void TensorDesc::set(DType dtype, std::span<const int64_t> sizes, std::span<const int64_t> strides,
                     const char* op) {
  KILN_CHECK(sizes.size() >= 4 && sizes.size() <= CUDNN_DIM_MAX && strides.size() == sizes.size(),
             "{}: cuDNN takes tensors of 4 to {} dims, got {}", op, CUDNN_DIM_MAX, sizes.size());
  std::vector<int> dims, steps;
  for (size_t d = 0; d < sizes.size(); ++d) {
    KILN_CHECK(sizes[d] <= INT32_MAX && strides[d] <= INT32_MAX && strides[d] >= 0,
               "{}: size {} or stride {} is out of cuDNN's int range", op, sizes[d], strides[d]);
    dims.push_back(static_cast<int>(sizes[d]));
    // cuDNN rejects a zero stride; a size-1 dim's stride is never used, so any positive one does.
    steps.push_back(static_cast<int>(sizes[d] == 1 && strides[d] == 0 ? 1 : strides[d]));
  }
  check(cudnnSetTensorNdDescriptor(desc_, data_type(dtype, op), static_cast<int>(dims.size()), dims.data(),
                                   steps.data()),
        op);
}

FilterDesc::FilterDesc() { check(cudnnCreateFilterDescriptor(&desc_), "cudnnCreateFilterDescriptor"); }
FilterDesc::~FilterDesc() { cudnnDestroyFilterDescriptor(desc_); }

void FilterDesc::set(DType dtype, const Shape& shape, bool channels_last, const char* op) {
  for (int64_t s : shape) KILN_CHECK(s <= INT32_MAX, "{}: weight size {} exceeds cuDNN's int range", op, s);
  check(cudnnSetFilter4dDescriptor(desc_, data_type(dtype, op), channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   static_cast<int>(shape[0]), static_cast<int>(shape[1]), static_cast<int>(shape[2]),
                                   static_cast<int>(shape[3])),
        op);
}

ConvDesc::ConvDesc() { check(cudnnCreateConvolutionDescriptor(&desc_), "cudnnCreateConvolutionDescriptor"); }
ConvDesc::~ConvDesc() { cudnnDestroyConvolutionDescriptor(desc_); }

PoolDesc::PoolDesc() { check(cudnnCreatePoolingDescriptor(&desc_), "cudnnCreatePoolingDescriptor"); }
PoolDesc::~PoolDesc() { cudnnDestroyPoolingDescriptor(desc_); }

Tensor workspace(int64_t bytes, Device device) {
  return empty({std::max<int64_t>(bytes, 1)}, {.dtype = DType::u8, .device = device});
}

bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) return false;
  // Walk the dims from fastest to slowest in NHWC order: C, W, H, N.
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

Tensor empty_channels_last(const Shape& shape, DType dtype, Device device) {
  return empty({shape[0], shape[2], shape[3], shape[1]}, {.dtype = dtype, .device = device}).permute({0, 3, 1, 2});
}

Tensor in_layout(const Tensor& t, bool channels_last) {
  if (!channels_last) return t.contiguous();
  if (is_channels_last(t)) return t;
  Tensor copy = empty_channels_last(t.shape(), t.dtype(), t.device());
  copy.copy_(t);
  return copy;
}

}  // namespace kiln::cuda::dnn
