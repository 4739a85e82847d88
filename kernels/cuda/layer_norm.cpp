// CUDA kernels of layer_norm and layer_norm_backward with kernels/cpu/norm.cpp's arithmetic:
// the input seen as [M, K] rows, row sums in f64, elementwise work in the compute type (f32
// for f16/bf16), statistics in f32 (f64 for f64 inputs).
//
// A row is eight threads, and lane j of the eight sums the elements j, j + 8, ... below the
// last multiple of 8 in order: the lanes of the CPU's accumulate(), which then adds the tail
// and the eight lanes in order, as every thread of the row does here after a shuffle. So the
// mean, rstd, output and grad_input are the CPU's to the bit (sqrt and division are IEEE on
// both, and NVRTC contracts no multiply-add). grad_weight and grad_bias are column sums over
// the rows in f64, one thread per column in row order: the CPU's numbers when it runs the
// rows as one chunk; when its threads split the rows, it adds per-chunk partial sums, and
// the two differ by f64 rounding (a 1e-15 relative hair) before the rounding to the
// parameter's dtype.
#include "core/grad_mode.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::f16, DType::bf16};

constexpr int kLanes = 8;  // kernels/cpu/norm.cpp's accumulate() lanes

// ROW_SUM(expr): the sum of expr (a double of the element i) over the row, in accumulate()'s
// order, in every thread of the row's eight. lane (0..7) and k are in scope.
const char* const kRowSum = R"(
#define ROW_SUM(result, expr)                                               \
  {                                                                         \
    const long long body_ = k - k % 8;                                      \
    double lane_sum_ = 0.0;                                                 \
    if (active)                                                             \
      for (long long i = lane; i < body_; i += 8) lane_sum_ += (expr);      \
    double total_ = 0.0;                                                    \
    if (active)                                                             \
      for (long long i = body_; i < k; ++i) total_ += (expr);               \
    for (int l_ = 0; l_ < 8; ++l_) total_ += __shfl_sync(0xffffffffu, lane_sum_, l_, 8); \
    result = total_;                                                        \
  }
)";

const KernelFamily kLayerNorm("layer_norm", std::string(kRowSum) + R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* x, const C* w, const C* b, T* y, C* means, C* rstds, long long rows,
                                long long k, double eps) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long r = t / 8;
  const int lane = (int)(t % 8);
  const bool active = r < rows;  // inactive threads still take part in the shuffles
  const T* p = x + (active ? r : 0) * k;
  double sum, sq;
  ROW_SUM(sum, (double)(C)p[i]);
  const double m = sum / (double)k;
  ROW_SUM(sq, ((double)(C)p[i] - m) * ((double)(C)p[i] - m));
  if (!active) return;
  const double var = sq / (double)k;
  const double rs = 1.0 / sqrt(var + eps);
  if (lane == 0) {
    means[r] = (C)m;
    rstds[r] = (C)rs;
  }
  const C mc = (C)m, rc = (C)rs;
  T* q = y + r * k;
  for (long long i = lane; i < k; i += 8) {
    if (w && b) q[i] = T(((C)p[i] - mc) * rc * w[i] + b[i]);
    else if (w) q[i] = T(((C)p[i] - mc) * rc * w[i]);
    else if (b) q[i] = T(((C)p[i] - mc) * rc + b[i]);
    else q[i] = T(((C)p[i] - mc) * rc);
  }
}
)",
                              kFloats);

// grad_input: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w.
const KernelFamily kLayerNormBackward("layer_norm_backward", std::string(kRowSum) + R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* grad, const T* x, const C* means, const C* rstds, const C* w, T* dx,
                                long long rows, long long k) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long r = t / 8;
  const int lane = (int)(t % 8);
  const bool active = r < rows;
  const long long row = active ? r : 0;
  const T* xp = x + row * k;
  const T* gp = grad + row * k;
  const C m = means[row], rstd = rstds[row];
#define XHAT(i) (((C)xp[i] - m) * rstd)
#define GW(i) (w ? (C)gp[i] * w[i] : (C)gp[i])
  double sum_g, sum_gx;
  ROW_SUM(sum_g, (double)GW(i));
  ROW_SUM(sum_gx, (double)GW(i) * (double)XHAT(i));
  if (!active) return;
  const C a = (C)(sum_g / (double)k), c = (C)(sum_gx / (double)k);
  T* dp = dx + r * k;
  for (long long i = lane; i < k; i += 8) {
    const C xhat = XHAT(i), gw = GW(i);
    dp[i] = T(rstd * (gw - a - xhat * c));
  }
}
)",
                                      kFloats);

// grad_weight and grad_bias in f64: column sums over the rows, in row order.
const KernelFamily kLayerNormParamGrads("layer_norm_param_grads", R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* grad, const T* x, const C* means, const C* rstds, double* dw, double* db,
                                long long rows, long long k) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= k) return;
  double sw = 0.0, sb = 0.0;
  for (long long r = 0; r < rows; ++r) {
    const double dy = (double)(C)grad[r * k + i];
    const C xhat = ((C)x[r * k + i] - means[r]) * rstds[r];
    sw += dy * (double)xhat;
    sb += dy;
  }
  dw[i] = sw;
  db[i] = sb;
}
)",
                                        kFloats);

DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// t contiguous in the compute dtype of an input of dtype `input`; undefined stays undefined.
Tensor in_compute_dtype(const Tensor& t, DType input) {
  return t.defined() ? t.to(compute_dtype(input)).contiguous() : Tensor();
}

const void* ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }


long long threads_for_rows(long long rows) { return rows * kLanes; }

// (input, weight?, bias?) -> (out, mean, rstd)
void layer_norm(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const double eps = attrs.has("eps") ? attrs.f("eps") : 1e-5;
  const Tensor x = in[0].contiguous();
  const long long k = numel_of(attrs.ints("normalized_shape"));
  const long long rows = k ? x.numel() / k : 0;
  if (rows == 0) return;
  const Tensor w = in_compute_dtype(in[1], x.dtype()), b = in_compute_dtype(in[2], x.dtype());
  const Contiguous y(out[0]), mean(out[1]), rstd(out[2]);
  kLayerNorm.launch(x.dtype(), x.device().index, threads_for_rows(rows), x.data_ptr(), ptr(w), ptr(b), y.ptr(),
                    mean.ptr(), rstd.ptr(), rows, k, eps);
  y.finish();
  mean.finish();
  rstd.finish();
}

// An f64 vector of sums into a parameter gradient of any floating dtype, rounded as the
// CPU's write_values: to the dtype's compute type first.
void write_sums(const Tensor& sums, const Tensor& out) {
  const Tensor v = sums.to(compute_dtype(out.dtype())).view(out.shape());
  Tensor(out).copy_(v);
}

// (grad_out, input, mean, rstd, weight?) -> (grad_input, grad_weight, grad_bias)
void layer_norm_backward(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const Tensor x = in[1].contiguous();
  const Tensor grad = in[0].to(x.dtype()).contiguous();
  const long long k = numel_of(attrs.ints("normalized_shape"));
  const long long rows = k ? x.numel() / k : 0;
  const Tensor mean = in_compute_dtype(in[2], x.dtype()), rstd = in_compute_dtype(in[3], x.dtype());
  const Tensor w = in_compute_dtype(in[4], x.dtype());
  const int device = x.device().index;
  const DType t = x.dtype();
  if (rows > 0) {
    const Contiguous dx(out[0]);
    kLayerNormBackward.launch(t, device, threads_for_rows(rows), grad.data_ptr(), x.data_ptr(), mean.data_ptr(),
                              rstd.data_ptr(), ptr(w), dx.ptr(), rows, k);
    dx.finish();
  }
  if (k == 0) return;
  const Tensor dw = empty({k}, {.dtype = DType::f64, .device = x.device()});
  const Tensor db = empty({k}, {.dtype = DType::f64, .device = x.device()});
  kLayerNormParamGrads.launch(t, device, k, grad.data_ptr(), x.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                              dw.data_ptr(), db.data_ptr(), rows, k);
  write_sums(dw, out[1]);
  write_sums(db, out[2]);
}

struct Registrar {
  Registrar() {
    register_kernel("layer_norm", DeviceType::cuda, layer_norm);
    register_kernel("layer_norm_backward", DeviceType::cuda, layer_norm_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
