// CUDA kernels of matmul, mm, bmm and addmm through cuBLAS (one strided-batched GEMM per
// call). cuBLAS is column-major: a row-major C = A B is the column-major C^T = B^T A^T, so
// the operands go in swapped. An operand whose rows or columns are contiguous goes as it
// is (transposed when its columns are); other layouts are copied first. f16 and bf16
// multiply with f32 accumulation; f32 uses TF32 tensor cores only when
// cuda::set_allow_tf32(true) says so (PyTorch's default for matmul is off, too).
//
// addmm with a bias vector and beta 1 (a Linear layer: bias [n] or [1, n] over a [m, n]
// product) goes through cuBLASLt instead, the bias added in the GEMM's epilogue
// (CUBLASLT_EPILOGUE_BIAS): no copy of the broadcast bias into the output first, no read
// of it by the GEMM. cuBLASLt takes the bias as a packed vector of the output's dtype,
// one element per row of its column-major D, which is per column n of kiln's row-major
// output. Where its heuristic offers no algorithm (f64, odd alignments), or with
// KILN_CUBLASLT=0, addmm takes the cuBLAS path.
//
// The compiler's activation epilogues (core/ops/linalg.h) go through cuBLASLt too:
// addmm_activation as RELU_BIAS or GELU_AUX_BIAS (the GELU's input written to the auxiliary
// matrix for the backward), mm_gelu_backward as DGELU_BGRAD (the auxiliary matrix read, the
// bias gradient written to the bias vector). cuBLASLt's GELU is the tanh approximation, with
// its own arithmetic, so these agree with kiln's gelu kernels to rounding, not bit for bit.
// The auxiliary matrix's leading dimension must be a multiple of 8; otherwise, and where the
// heuristic offers no algorithm, they run as the chain of ops (kernels/gemm_activation.h).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/matmul.h"
#include "kernels/gemm_activation.h"
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

// ---- cuBLASLt: bias and activations in the epilogue ----

std::atomic<int64_t> g_lt_bias_calls{0};
std::atomic<int64_t> g_lt_activation_calls{0};

void check_lt(cublasStatus_t s, const char* what) {
  KILN_CHECK(s == CUBLAS_STATUS_SUCCESS, "addmm: cuBLASLt {} failed: {} ({})", what, status_name(s), static_cast<int>(s));
}

cublasLtHandle_t lt_handle_for(int device) {
  static std::array<cublasLtHandle_t, 64> handles{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  cublasLtHandle_t& h = handles.at(static_cast<size_t>(device));
  if (!h) {
    DeviceGuard guard(device);
    check_lt(cublasLtCreate(&h), "cublasLtCreate");
  }
  return h;
}

bool lt_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUBLASLT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// RAII for the three descriptor kinds.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~LtMatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct LtLayout {
  cublasLtMatrixLayout_t l = nullptr;
  ~LtLayout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  ~LtPreference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

constexpr size_t kLtWorkspace = 32u << 20;  // what cuBLASLt may use (PyTorch's default too)

// The largest power of two up to 256 dividing the address.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// What cuBLASLt does to a product in its epilogue.
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
  // A packed [n] vector of the output's dtype: read by BIAS, RELU_BIAS and GELU_AUX_BIAS,
  // written by DGELU_BGRAD (the bias gradient).
  const void* bias = nullptr;
  // An [m, n] matrix of the output's dtype, row-major with n a multiple of 8: written by
  // GELU_AUX_BIAS (the GELU's input), read by DGELU_BGRAD. Null for the others.
  const void* aux = nullptr;
};

// o = epilogue(alpha * a @ b) for [m, k] @ [k, n] into a contiguous [m, n] o. Returns false,
// having done nothing, when cuBLASLt offers no algorithm for the call.
bool lt_matmul(const Tensor& a2, const Tensor& b2, const Tensor& o, double alpha, const LtEpilogue& e) {
  const int64_t m = o.size(0), n = o.size(1), k = a2.size(1);
  const Operand a = operand(a2.unsqueeze(0)), b = operand(b2.unsqueeze(0));
  const DType dt = o.dtype();
  const cudaDataType type = data_type(dt, "addmm");
  if (dt == DType::f64 || k == 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  const cublasComputeType_t compute = dt == DType::f32 && g_allow_tf32.load() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                              : CUBLAS_COMPUTE_32F;
  const int device = o.device().index;
  DeviceGuard guard(device);
  // Column-major D^T (n x m) = op(B^T) (n x k) * op(A^T) (k x m); the layouts describe the
  // matrices as stored, before the op.
  LtMatmulDesc desc;
  check_lt(cublasLtMatmulDescCreate(&desc.d, compute, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t op_b = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const void* bias_ptr = e.bias;
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a), "TRANSB");
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.kind, sizeof e.kind), "EPILOGUE");
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr),
           "BIAS_POINTER");
  if (e.aux) {
    // The auxiliary matrix is laid out as D: column-major n x m, leading dimension n.
    const void* aux_ptr = e.aux;
    const int64_t aux_ld = n;
    check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_ptr, sizeof aux_ptr),
             "EPILOGUE_AUX_POINTER");
    check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
             "EPILOGUE_AUX_LD");
  }
  LtLayout first, second, result;
  check_lt(cublasLtMatrixLayoutCreate(&first.l, type, static_cast<uint64_t>(b.trans ? k : n),
                                      static_cast<uint64_t>(b.trans ? n : k), b.ld),
           "layout of b");
  check_lt(cublasLtMatrixLayoutCreate(&second.l, type, static_cast<uint64_t>(a.trans ? m : k),
                                      static_cast<uint64_t>(a.trans ? k : m), a.ld),
           "layout of a");
  check_lt(cublasLtMatrixLayoutCreate(&result.l, type, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
           "layout of the output");
  LtPreference pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref.p), "preference");
  const size_t workspace_bytes = kLtWorkspace;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "workspace preference");
  // The heuristic assumes 256-byte aligned matrices unless told: say what they are (a view
  // into a larger tensor, an allocator block at a smaller granularity).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b.t.data_ptr()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a.t.data_ptr()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, o.data_ptr()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, o.data_ptr()}};
  for (const auto& [attribute, pointer] : aligned) {
    const uint32_t bytes = alignment_of(pointer);
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, attribute, &bytes, sizeof bytes), "alignment preference");
  }
  const cublasLtHandle_t h = lt_handle_for(device);
  // The heuristic's answer, once per problem (it costs tens of microseconds of host time):
  // everything it was told is in the key.
  const std::string key = fmt::format("{}|{}|{}|{}|{}x{}x{}|{}{}|{}|{}|{}|{}|{}|{}|{}", device, static_cast<int>(e.kind),
                                      static_cast<int>(dt), static_cast<int>(compute), m, n, k, b.trans, a.trans, b.ld,
                                      a.ld, alignment_of(b.t.data_ptr()), alignment_of(a.t.data_ptr()),
                                      alignment_of(o.data_ptr()), alignment_of(bias_ptr),
                                      e.aux ? alignment_of(e.aux) : 0);
  static std::mutex cache_mutex;
  static std::map<std::string, std::optional<cublasLtMatmulHeuristicResult_t>> cache;
  std::optional<cublasLtMatmulHeuristicResult_t> choice;
  {
    std::lock_guard lock(cache_mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
      cublasLtMatmulHeuristicResult_t result_found{};
      int count = 0;
      const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(h, desc.d, first.l, second.l, result.l, result.l,
                                                                  pref.p, 1, &result_found, &count);
      if (asked == CUBLAS_STATUS_SUCCESS && count > 0) choice = result_found;
      it = cache.emplace(key, choice).first;
    }
    choice = it->second;
  }
  if (!choice) return false;
  const cublasLtMatmulHeuristicResult_t& found = *choice;
  const Tensor workspace = empty({static_cast<int64_t>(std::max<size_t>(found.workspaceSize, 1))},
                                 {.dtype = DType::u8, .device = o.device()});
  const float alpha_f = static_cast<float>(alpha), zero = 0.0f;
  const cublasStatus_t ran =
      cublasLtMatmul(h, desc.d, &alpha_f, b.t.data_ptr(), first.l, a.t.data_ptr(), second.l, &zero, o.data_ptr(),
                     result.l, o.data_ptr(), result.l, &found.algo, workspace.data_ptr(), found.workspaceSize,
                     stream_of(device));
  if (ran != CUBLAS_STATUS_SUCCESS) {
    // A launch cuBLASLt refuses (it queued nothing): this problem takes the cuBLAS path from
    // now on. The GPU tests count the epilogue calls, so a refusal there shows.
    std::lock_guard lock(cache_mutex);
    cache[key] = std::nullopt;
    return false;
  }
  ++(e.kind == CUBLASLT_EPILOGUE_BIAS ? g_lt_bias_calls : g_lt_activation_calls);
  return true;
}

// The bias of addmm(bias, a, b) as a vector over the output's columns, when it is one:
// [n] or [1, n] (any strides; made packed, 16-byte aligned and of dtype `dt`: cuBLASLt's
// bias kernels have faulted on less aligned vectors, pytorch/pytorch#194497). Undefined
// otherwise.
Tensor bias_vector(const Tensor& bias, int64_t n, DType dt) {
  const bool row = (bias.dim() == 1 && bias.size(0) == n) || (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == n);
  if (!row || n <= 1) return {};
  Tensor v = bias.reshape({n}).to(dt).contiguous();
  return alignment_of(v.data_ptr()) < 16 ? v.clone() : v;
}

void addmm_kernel(Span in, Span out, const Attrs& attrs) {
  const double beta = attrs.has("beta") ? attrs.scalar("beta").to_double() : 1.0;
  const double alpha = attrs.has("alpha") ? attrs.scalar("alpha").to_double() : 1.0;
  data_type(in[1].dtype(), "addmm");
  // Not when the bias is (in) the output: the program's in-place accumulation, which the
  // cuBLAS path below does with beta.
  if (beta == 1.0 && lt_enabled() && out[0].is_contiguous() && out[0].numel() > 0 &&
      in[0].storage() != out[0].storage()) {
    const Tensor vec = bias_vector(in[0], out[0].size(1), out[0].dtype());
    if (vec.defined() && lt_matmul(in[1], in[2], out[0], alpha, {.bias = vec.data_ptr()})) return;
  }
  into_contiguous(out[0], [&](const Tensor& o) {
    // The bias, broadcast (beta == 0 never reads it); already there when the program
    // accumulates into it in place (the compiler's gemm_epilogues).
    if (beta != 0 && !same_view(o, in[0])) Tensor(o).copy_(in[0]);
    gemm("addmm", in[1].unsqueeze(0), in[2].unsqueeze(0), o.unsqueeze(0), alpha, beta);
  });
}

// Whether t can be cuBLASLt's auxiliary matrix: contiguous [m, n] with n a multiple of 8 (the
// leading dimension cuBLASLt requires), 16-byte aligned.
bool fits_aux(const Tensor& t) {
  return t.is_contiguous() && t.dim() == 2 && t.size(1) % 8 == 0 && alignment_of(t.data_ptr()) >= 16;
}

// in: (bias, a, b); out: (out) for relu, (out, pre) for gelu_tanh.
void addmm_activation_kernel(Span in, Span out, const Attrs& attrs) {
  data_type(in[1].dtype(), "addmm_activation");
  const bool gelu = attrs.str("activation") == "gelu_tanh";
  if (lt_enabled() && out[0].is_contiguous() && out[0].numel() > 0 && (!gelu || fits_aux(out[1]))) {
    const Tensor vec = bias_vector(in[0], out[0].size(1), out[0].dtype());
    const LtEpilogue e{.kind = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_BIAS,
                       .bias = vec.defined() ? vec.data_ptr() : nullptr,
                       .aux = gelu ? out[1].data_ptr() : nullptr};
    if (vec.defined() && lt_matmul(in[1], in[2], out[0], 1.0, e)) return;
  }
  addmm_activation_composed(in, out, attrs);
}

// in: (g, w, pre); out: (grad_pre, grad_bias). The bias gradient is written into a packed,
// 16-byte aligned vector (a copy when the output is not one).
void mm_gelu_backward_kernel(Span in, Span out, const Attrs& attrs) {
  data_type(in[0].dtype(), "mm_gelu_backward");
  const Tensor& pre = in[2];
  if (lt_enabled() && out[0].is_contiguous() && out[0].numel() > 0 && out[0].size(1) > 1 && fits_aux(pre)) {
    const bool direct = out[1].is_contiguous() && alignment_of(out[1].data_ptr()) >= 16;
    const Tensor grad_bias = direct ? out[1] : empty(out[1].shape(), {.dtype = out[1].dtype(), .device = out[1].device()});
    const LtEpilogue e{.kind = CUBLASLT_EPILOGUE_DGELU_BGRAD, .bias = grad_bias.data_ptr(), .aux = pre.data_ptr()};
    if (lt_matmul(in[0], in[1], out[0], 1.0, e)) {
      if (!direct) Tensor(out[1]).copy_(grad_bias);
      return;
    }
  }
  mm_gelu_backward_composed(in, out, attrs);
}

struct Registrar {
  Registrar() {
    register_kernel("addmm_activation", DeviceType::cuda, addmm_activation_kernel);
    register_kernel("mm_gelu_backward", DeviceType::cuda, mm_gelu_backward_kernel);
    register_kernel("matmul", DeviceType::cuda, matmul_kernel);
    register_kernel("mm", DeviceType::cuda, matmul_kernel);
    register_kernel("bmm", DeviceType::cuda, matmul_kernel);
    register_kernel("addmm", DeviceType::cuda, addmm_kernel);
  }
} registrar;

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
int64_t cublaslt_bias_epilogues() { return g_lt_bias_calls.load(); }
int64_t cublaslt_activation_epilogues() { return g_lt_activation_calls.load(); }
bool allow_tf32() { return g_allow_tf32.load(); }

}  // namespace kiln::cuda
