// CUDA kernels of batch norm's statistics ops, which split_batch_norm makes of a training
// batch norm and its backward (compiler/passes/batch_norm_split.cpp): the per-channel sums in
// one launch each, the pointwise work around them being generated kernels. Unlike cuDNN's
// path (kernels/cuda/norm.cpp), 16-bit inputs are read as they are, with f32 arithmetic and
// f64 sums: no f32 copies.
//
// One launch per op. x is seen as [rows, C] (NHWC: row r, channel c at r * C + c; NCHW [N,
// C, L]: at ((r / L) * C + c) * L + r % L). A block of 256 threads takes a tile of 32
// channels (consecutive threads, so a warp reads 32 consecutive values of a NHWC row) and a
// chunk of rows, which its 8 row lanes stride over; it adds its lanes in order and writes the
// chunk's partial sums. The last block of a tile to finish (a counter per tile, incremented
// after a __threadfence) adds the chunks' partials in chunk order and computes the
// per-channel results, so they do not depend on scheduling; it sets the counter back to 0.
// The counters live for the process, one array per device, made at a first call outside any
// CUDA graph capture. NCHW reads are strided (one channel per thread): correct, not fast;
// the CUDA target runs batch norm NHWC.
//
// The arithmetic is kernels/cpu/norm.cpp's: the forward's sums are shifted by each channel's
// first value (mean = k + S1 / n, var = S2 / n - (S1 / n)^2), the backward's sum dy and
// dy (x - mean); the results agree with the CPU's to f64 rounding of the sums (another
// order), then the rounding to the statistics dtype.
#include <mutex>
#include <unordered_map>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::f16, DType::bf16};

constexpr int kTile = 32, kRowLanes = 8;

// ELEM(r, c): the index of row r, channel c; PARTIALS(...) combines a block's row lanes into
// the chunk's partial sums and decides whether this block finishes the tile.
const char* const kChannelSums = R"(
#define ELEM(r, c) (nhwc ? (r) * channels + (c) : (((r) / l) * channels + (c)) * l + (r) % l)
#define BLOCK_SUMS(s1, s2)                                                                      \
  __shared__ double sh1_[256], sh2_[256];                                                       \
  __shared__ int last_;                                                                         \
  sh1_[threadIdx.x] = s1;                                                                       \
  sh2_[threadIdx.x] = s2;                                                                       \
  __syncthreads();                                                                              \
  if (lane_r == 0 && active) {                                                                  \
    double a1 = 0.0, a2 = 0.0;                                                                  \
    for (int j = 0; j < 8; ++j) {                                                               \
      a1 += sh1_[j * 32 + lane_c];                                                              \
      a2 += sh2_[j * 32 + lane_c];                                                              \
    }                                                                                           \
    partials[(chunk * 2) * channels + c] = a1;                                                  \
    partials[(chunk * 2 + 1) * channels + c] = a2;                                              \
  }                                                                                             \
  __threadfence();                                                                              \
  __syncthreads();                                                                              \
  if (threadIdx.x == 0) last_ = atomicAdd(&counters[tile], 1u) == (unsigned int)(chunks - 1);   \
  __syncthreads();                                                                              \
  if (!last_) return;                                                                           \
  __threadfence();                                                                              \
  if (threadIdx.x == 0) counters[tile] = 0u;                                                    \
  if (lane_r != 0 || !active) return;                                                           \
  double t1 = 0.0, t2 = 0.0;                                                                    \
  {                                                                                             \
    volatile const double* p_ = partials;                                                       \
    for (long long k_ = 0; k_ < chunks; ++k_) {                                                 \
      t1 += p_[(k_ * 2) * channels + c];                                                        \
      t2 += p_[(k_ * 2 + 1) * channels + c];                                                    \
    }                                                                                           \
  }
#define BLOCK_SETUP                                                                             \
  const long long tiles = (channels + 31) / 32;                                                 \
  const long long tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;                        \
  const int lane_c = (int)(threadIdx.x % 32), lane_r = (int)(threadIdx.x / 32);                 \
  const long long c = tile * 32 + lane_c;                                                       \
  const bool active = c < channels;                                                             \
  const long long r_begin = chunk * chunk_rows;                                                 \
  const long long r_end = r_begin + chunk_rows < rows ? r_begin + chunk_rows : rows;
)";

// (x) -> mean, invstd, the running statistics' update, scale = invstd * w and shift = b -
// mean * invstd * w (w and b may be null: 1 and 0).
const KernelFamily kTrainStats("batch_norm_train_stats", std::string(kChannelSums) + R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* x, const C* w, const C* b, const C* running_mean, const C* running_var,
                                C* mean_out, C* invstd_out, C* new_mean, C* new_var, C* scale_out, C* shift_out,
                                double* partials, unsigned int* counters, long long channels, long long rows,
                                long long l, int nhwc, long long chunk_rows, long long chunks, double eps,
                                double momentum) {
  BLOCK_SETUP
  const double k = active ? (double)(C)x[ELEM(0, c)] : 0.0;
  double s1 = 0.0, s2 = 0.0;
  if (active)
    for (long long r = r_begin + lane_r; r < r_end; r += 8) {
      const double d = (double)(C)x[ELEM(r, c)] - k;
      s1 += d;
      s2 += d * d;
    }
  BLOCK_SUMS(s1, s2)
  const double n = (double)rows;
  const double m1 = t1 / n;
  const double mean = k + m1;
  double var = t2 / n - m1 * m1;
  if (var < 0.0) var = 0.0;
  const double invstd = 1.0 / sqrt(var + eps);
  const double wc = w ? (double)w[c] : 1.0, bc = b ? (double)b[c] : 0.0;
  mean_out[c] = (C)mean;
  invstd_out[c] = (C)invstd;
  new_mean[c] = (C)((1 - momentum) * (double)running_mean[c] + momentum * mean);
  new_var[c] = (C)((1 - momentum) * (double)running_var[c] + momentum * var * (n / (n - 1)));
  scale_out[c] = (C)(invstd * wc);
  shift_out[c] = (C)(bc - mean * invstd * wc);
}
)",
                               kFloats);

// (grad, x, relu?) -> grad_weight, grad_bias, mean_dy, k, scale of batch_norm_backward in
// training, dy being grad, or where(relu > 0, grad, 0) when relu is given.
const KernelFamily kGradStats("batch_norm_grad_stats", std::string(kChannelSums) + R"(
typedef SCALAR T;
typedef COMPUTE C;
extern "C" __global__ void NAME(const T* grad, const T* x, const T* relu, const C* w, const C* save_mean,
                                const C* save_invstd, C* grad_weight, C* grad_bias, C* mean_dy_out, C* k_out,
                                C* scale_out, double* partials, unsigned int* counters, long long channels,
                                long long rows, long long l, int nhwc, long long chunk_rows, long long chunks) {
  BLOCK_SETUP
  const double m = active ? (double)save_mean[c] : 0.0;
  double s1 = 0.0, s2 = 0.0;
  if (active)
    for (long long r = r_begin + lane_r; r < r_end; r += 8) {
      const long long i = ELEM(r, c);
      const double dy = relu && !((C)relu[i] > (C)0) ? 0.0 : (double)(C)grad[i];
      s1 += dy;
      s2 += dy * ((double)(C)x[i] - m);
    }
  BLOCK_SUMS(s1, s2)
  const double n = (double)rows;
  const double invstd = (double)save_invstd[c];
  const double wc = w ? (double)w[c] : 1.0;
  grad_bias[c] = (C)t1;
  grad_weight[c] = (C)(t2 * invstd);
  mean_dy_out[c] = (C)(t1 / n);
  k_out[c] = (C)(t2 * invstd * invstd / n);
  scale_out[c] = (C)(wc * invstd);
}
)",
                              kFloats);

DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// A per-channel input in the compute dtype, contiguous; undefined stays undefined.
Tensor per_channel(const Tensor& t, DType compute) {
  return t.defined() ? t.to(compute).contiguous() : Tensor();
}
const void* ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// A per-channel output written by the kernel in the compute dtype: the output itself when it
// is one, else a buffer finish() converts into it.
struct StatOut {
  Tensor out, buffer;
  StatOut(const Tensor& o, DType compute)
      : out(o),
        buffer(o.dtype() == compute && o.is_contiguous()
                   ? o
                   : empty(o.shape(), {.dtype = compute, .device = o.device()})) {}
  void* ptr() const { return buffer.data_ptr(); }
  void finish() const {
    if (!buffer.same(out)) Tensor(out).copy_(buffer);
  }
};

// The tiles' counters on x's device: zero between launches (each launch's last blocks set
// them back), made once per device.
unsigned int* counters_for(const Tensor& x, int64_t tiles) {
  constexpr int64_t kCounters = 4096;
  KILN_CHECK(tiles <= kCounters, "batch norm statistics: {} channels exceed the kernels' {}",
             tiles * kTile, kCounters * kTile);
  static std::mutex mutex;
  static std::unordered_map<std::string, Tensor> counters;
  std::lock_guard lock(mutex);
  Tensor& t = counters[x.device().str()];
  if (!t.defined()) {
    // Made outside any CUDA graph capture: a capture's allocations come from its private
    // pool, which the counters must not live in (compile's reduce-overhead mode captures
    // after an uncaptured warm-up run, which makes them).
    KILN_CHECK(
        !x.device().is_cuda() ||
            capture_replay_stream(static_cast<int>(x.device().index)) == nullptr,
        "batch norm statistics on {}: the kernels' counters are made by a first call outside a "
        "CUDA graph capture; run the step once uncaptured first",
        x.device().str());
    t = zeros({kCounters}, {.dtype = DType::i32, .device = x.device()});
  }
  return static_cast<unsigned int*>(t.data_ptr());
}

// The launch geometry of [rows, C]: enough chunks to fill a GPU (about 1024 blocks in all),
// each at least 64 rows.
struct Geometry {
  long long channels, rows, l, tiles, chunk_rows, chunks;
  int nhwc;
};
Geometry geometry_of(const Tensor& x, MemoryFormat format) {
  Geometry g{};
  g.channels = x.size(1);
  g.l = 1;
  for (int64_t d = 2; d < x.dim(); ++d) g.l *= x.size(d);
  g.rows = x.size(0) * g.l;
  g.nhwc = format == MemoryFormat::channels_last ? 1 : 0;
  g.tiles = (g.channels + kTile - 1) / kTile;
  const long long wanted = std::max<long long>(1, 1024 / g.tiles);
  g.chunks = std::max<long long>(1, std::min<long long>(wanted, (g.rows + 63) / 64));
  g.chunk_rows = (g.rows + g.chunks - 1) / g.chunks;
  g.chunks = (g.rows + g.chunk_rows - 1) / g.chunk_rows;
  return g;
}

Tensor partials_for(const Tensor& x, const Geometry& g) {
  return empty({g.chunks * 2 * g.channels}, {.dtype = DType::f64, .device = x.device()});
}

// (x, weight?, bias?, running_mean, running_var) -> (save_mean, save_invstd, new_running_mean,
// new_running_var, scale, shift)
void batch_norm_train_stats(Span in, Span out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const double eps = attrs.has("eps") ? attrs.f("eps") : 1e-5;
  const double momentum = attrs.has("momentum") ? attrs.f("momentum") : 0.1;
  const MemoryFormat format = in[0].suggest_memory_format();
  const Tensor x = in[0].contiguous(format);
  const DType compute = compute_dtype(x.dtype());
  const Geometry g = geometry_of(x, format);
  if (g.rows == 0 || g.channels == 0) return;
  const Tensor w = per_channel(in[1], compute), b = per_channel(in[2], compute);
  const Tensor rm = per_channel(in[3], compute), rv = per_channel(in[4], compute);
  const StatOut mean(out[0], compute), invstd(out[1], compute), new_mean(out[2], compute),
      new_var(out[3], compute), scale(out[4], compute), shift(out[5], compute);
  const Tensor partials = partials_for(x, g);
  unsigned int* counters = counters_for(x, g.tiles);
  kTrainStats.launch(x.dtype(), x.device().index, g.tiles * g.chunks * KernelFamily::kBlock,
                     x.data_ptr(), ptr(w), ptr(b), rm.data_ptr(), rv.data_ptr(), mean.ptr(),
                     invstd.ptr(), new_mean.ptr(), new_var.ptr(), scale.ptr(), shift.ptr(),
                     partials.data_ptr(), counters, g.channels, g.rows, g.l, g.nhwc, g.chunk_rows,
                     g.chunks, eps, momentum);
  for (const StatOut* o : {&mean, &invstd, &new_mean, &new_var, &scale, &shift}) o->finish();
}

// (grad_out, x, weight?, save_mean, save_invstd, relu_out?) -> (grad_weight, grad_bias,
// mean_dy, k, scale)
void batch_norm_grad_stats(Span in, Span out, const Attrs&) {
  NoGradGuard no_grad;
  const MemoryFormat format = in[1].suggest_memory_format() == MemoryFormat::channels_last
                                  ? MemoryFormat::channels_last
                                  : in[0].suggest_memory_format();
  const Tensor x = in[1].contiguous(format);
  Tensor grad = in[0].to(x.dtype()).contiguous(format);
  Tensor relu;
  if (in[5].defined()) {
    if (in[5].dtype() == x.dtype())
      relu = in[5].contiguous(format);
    else
      grad =
          where(in[5] > 0, in[0], 0).to(x.dtype()).contiguous(format);  // compared in its own dtype
  }
  const DType compute = compute_dtype(x.dtype());
  const Geometry g = geometry_of(x, format);
  if (g.rows == 0 || g.channels == 0) return;
  const Tensor w = per_channel(in[2], compute), mean = per_channel(in[3], compute),
               invstd = per_channel(in[4], compute);
  const StatOut grad_weight(out[0], compute), grad_bias(out[1], compute), mean_dy(out[2], compute),
      k(out[3], compute), scale(out[4], compute);
  const Tensor partials = partials_for(x, g);
  unsigned int* counters = counters_for(x, g.tiles);
  kGradStats.launch(x.dtype(), x.device().index, g.tiles * g.chunks * KernelFamily::kBlock,
                    grad.data_ptr(), x.data_ptr(), ptr(relu), ptr(w), mean.data_ptr(),
                    invstd.data_ptr(), grad_weight.ptr(), grad_bias.ptr(), mean_dy.ptr(), k.ptr(),
                    scale.ptr(), partials.data_ptr(), counters, g.channels, g.rows, g.l, g.nhwc,
                    g.chunk_rows, g.chunks);
  for (const StatOut* o : {&grad_weight, &grad_bias, &mean_dy, &k, &scale}) o->finish();
}

struct Registrar {
  Registrar() {
    register_kernel("batch_norm_train_stats", DeviceType::cuda, batch_norm_train_stats);
    register_kernel("batch_norm_grad_stats", DeviceType::cuda, batch_norm_grad_stats);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
