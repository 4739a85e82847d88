// CUDA kernels of matmul, mm, bmm and addmm through cuBLAS (one strided-batched GEMM per
// call). cuBLAS is column-major: a row-major C = A B is the column-major C^T = B^T A^T, so
// the operands go in swapped. An operand whose rows or columns are contiguous goes as it
// is (transposed when its columns are); other layouts are copied first. f16 and bf16
// multiply with f32 accumulation; f32 uses TF32 tensor cores only when
// cuda::set_allow_tf32(true) says so (PyTorch's default for matmul is off, too).
#include <cublas_v2.h>

#include <array>
#include <atomic>
#include <mutex>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

std::atomic<bool> g_allow_tf32{false};

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

void check_blas(cublasStatus_t s, const char* op) {
  KILN_CHECK(s == CUBLAS_STATUS_SUCCESS, "{}: cuBLAS failed: {} ({})", op, status_name(s), static_cast<int>(s));
}

// One handle per device, created on first use, bound to the device's current stream at
// each call.
cublasHandle_t handle_for(int device) {
  static std::array<cublasHandle_t, 64> handles{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  cublasHandle_t& h = handles.at(static_cast<size_t>(device));
  if (!h) {
    DeviceGuard guard(device);
    check_blas(cublasCreate(&h), "matmul");
  }
  check_blas(cublasSetStream(h, stream_of(device)), "matmul");
  return h;
}

// A [batch, rows, cols] operand as cuBLAS reads it.
struct Operand {
  Tensor t;          // the tensor whose memory is read (maybe a copy)
  bool trans = false;  // stored column-contiguous
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

Operand operand(Tensor t) {
  // Rows contiguous (row-major) or columns contiguous (stored transposed); else copy.
  auto fits = [](const Tensor& x, bool trans) {
    const int64_t rows = x.size(1), cols = x.size(2), rs = x.stride(1), cs = x.stride(2);
    if (!trans) return (cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols));
    return (rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows));
  };
  if (!fits(t, false) && !fits(t, true)) t = t.contiguous();
  Operand o;
  o.trans = !fits(t, false);
  const int64_t rows = t.size(1), cols = t.size(2);
  o.ld = o.trans ? (cols == 1 ? std::max<int64_t>(1, rows) : t.stride(2))
                 : (rows == 1 ? std::max<int64_t>(1, cols) : t.stride(1));
  o.batch_stride = t.size(0) == 1 ? 0 : t.stride(0);
  o.t = t;
  return o;
}

cudaDataType data_type(DType t, const char* op) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: fail("{}: dtype {} is not supported on CUDA (floating dtypes only)", op, t);
  }
}

// c[b] = alpha * a[b] @ b[b] + beta * c[b] for [batch, m, k] @ [batch, k, n] into a
// contiguous [batch, m, n] c.
void gemm(const char* op, const Tensor& a3, const Tensor& b3, const Tensor& c, double alpha, double beta) {
  const int64_t batch = c.size(0), m = c.size(1), n = c.size(2), k = a3.size(2);
  const int device = c.device().index;
  if (m == 0 || n == 0) return;
  const Operand a = operand(a3), b = operand(b3);
  const DType dt = c.dtype();
  const cudaDataType type = data_type(dt, op);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (dt == DType::f64) compute = CUBLAS_COMPUTE_64F;
  if (dt == DType::f32 && g_allow_tf32.load()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = dt == DType::f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = dt == DType::f64 ? static_cast<const void*>(&beta) : &beta_f;
  KILN_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && batch <= INT32_MAX,
             "{}: sizes [{},{},{}] x {} exceed cuBLAS's int range", op, m, n, k, batch);
  DeviceGuard guard(device);
  // Column-major C^T (n x m) = B^T (n x k) * A^T (k x m).
  check_blas(cublasGemmStridedBatchedEx(
                 handle_for(device), b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
                 static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha_p, b.t.data_ptr(), type,
                 static_cast<int>(b.ld), b.batch_stride, a.t.data_ptr(), type, static_cast<int>(a.ld),
                 a.batch_stride, beta_p, c.data_ptr(), type, static_cast<int>(n), m * n, static_cast<int>(batch),
                 compute, CUBLAS_GEMM_DEFAULT),
             op);
}

// Runs f(o) into out[0] directly when it is contiguous, else into a temporary copied back.
template <class F>
void into_contiguous(const Tensor& out, F&& f) {
  if (out.is_contiguous()) return f(out);
  Tensor tmp = empty(out.shape(), {.dtype = out.dtype(), .device = out.device()});
  f(tmp);
  Tensor(out).copy_(tmp);
}

void matmul_kernel(Span in, Span out, const Attrs&) {
  Tensor a = in[0], b = in[1];
  data_type(a.dtype(), "matmul");
  if (a.dim() == 1) a = a.unsqueeze(0);
  if (b.dim() == 1) b = b.unsqueeze(1);
  const Shape shapes[] = {Shape(a.shape().begin(), a.shape().end() - 2), Shape(b.shape().begin(), b.shape().end() - 2)};
  const Shape batch = broadcast_shapes(shapes, "matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1), count = numel_of(batch);
  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  // Flatten the batch dims: a view when the strides allow it (broadcast operands keep
  // stride 0), a copy otherwise.
  const Tensor a3 = a.expand(a_shape).reshape({count, m, k}), b3 = b.expand(b_shape).reshape({count, k, n});
  into_contiguous(out[0], [&](const Tensor& o) { gemm("matmul", a3, b3, o.view({count, m, n}), 1.0, 0.0); });
}

void addmm_kernel(Span in, Span out, const Attrs& attrs) {
  const double beta = attrs.has("beta") ? attrs.scalar("beta").to_double() : 1.0;
  const double alpha = attrs.has("alpha") ? attrs.scalar("alpha").to_double() : 1.0;
  data_type(in[1].dtype(), "addmm");
  into_contiguous(out[0], [&](const Tensor& o) {
    // The bias, broadcast (beta == 0 never reads it); already there when the program
    // accumulates into it in place (the compiler's gemm_epilogues).
    if (beta != 0 && !same_view(o, in[0])) Tensor(o).copy_(in[0]);
    gemm("addmm", in[1].unsqueeze(0), in[2].unsqueeze(0), o.unsqueeze(0), alpha, beta);
  });
}

struct Registrar {
  Registrar() {
    register_kernel("matmul", DeviceType::cuda, matmul_kernel);
    register_kernel("mm", DeviceType::cuda, matmul_kernel);
    register_kernel("bmm", DeviceType::cuda, matmul_kernel);
    register_kernel("addmm", DeviceType::cuda, addmm_kernel);
  }
} registrar;

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

}  // namespace kiln::cuda
