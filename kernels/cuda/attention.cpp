// CUDA kernels of scaled_dot_product_attention and its backward (core/ops/attention.h): the
// CPU kernels' algorithm (kernels/cpu/attention.cpp, FlashAttention's) as hand-written
// NVRTC kernels of 256 threads, f32 accumulation for f32, f16 and bf16 (f64 for f64).
//
// - forward: a block takes 16 queries of one head; thread (r, j) = (tid / 16, tid % 16).
//   Per tile of 16 keys the block loads k and v into shared memory, thread (r, j) makes the
//   score of query r and key j, every thread of row r then updates the row's running
//   maximum and sum (the online softmax; each of the 16 computes the same numbers), thread
//   (r, j) replaces its score by its (dropped) probability, and each thread updates its own
//   output columns j, j + 16, ... At the end it writes out and the row log-sum-exp.
// - backward: two kernels, so that no gradient is summed by atomics. grad_q: a block per 16
//   queries, as the forward, recomputing P = exp(score - lse) and dS = P (dP Z - D) per key
//   tile, D = rowsum(grad_out out); grad_k and grad_v: a block per 16 keys, walking the
//   query tiles (from the diagonal on when causal) with q and grad_out in shared memory.
//
// Extra memory is O(L) per head, as on the CPU; head dims (E and Ev) up to 128. Dropout
// uses dropout's Philox rule (core/philox.h) at the probability's row-major position, so
// the CPU and the GPU drop the same probabilities.
#include <algorithm>
#include <vector>

#include "core/ops/dropout.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr int64_t kTile = 16;     // queries (and keys) per tile; kTile * kTile = the block
constexpr int64_t kMaxDim = 128;  // the largest head dim the shared tiles hold

const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

// What every attention kernel shares: the tile sizes, the mask and the dropout factor.
constexpr const char* kCommon = R"(
#include "core/philox.h"
typedef SCALAR T;
typedef COMPUTE C;
#define TILE 16
#define MAXD 128
__device__ inline C neg_inf() { return (C)(-__longlong_as_double(0x7ff0000000000000LL)); }
// The score of query l and key s of head b after the mask and the causal rule.
__device__ inline C masked(C score, long long b, long long l, long long s, int causal, const C* fmask,
                           const bool* bmask, const long long* mask_base, long long mask_row, long long mask_col) {
  if (causal && s > l) return neg_inf();
  if (bmask && !bmask[mask_base[b] + l * mask_row + s * mask_col]) return neg_inf();
  if (fmask) score += fmask[mask_base[b] + l * mask_row + s * mask_col];
  return score;
}
__device__ inline C drop_factor(long long b, long long l, long long s, long long L, long long S, float p,
                                C keep_scale, unsigned long long seed, unsigned long long offset) {
  if (p <= 0.0f) return (C)1;
  const unsigned long long i = (unsigned long long)((b * L + l) * S + s);
  return kiln::philox::dropout_keep(seed, offset, i, p) ? keep_scale : (C)0;
}
)";

// q [B, L, E], k [B, S, E], v [B, S, Ev], out [B, L, Ev] contiguous; lse [B, L].
const KernelFamily kForward("attention_forward", std::string(kCommon) + R"(
extern "C" __global__ void __launch_bounds__(256) NAME(
    const T* q, const T* k, const T* v, const C* fmask, const bool* bmask, const long long* mask_base,
    long long mask_row, long long mask_col, long long L, long long S, int E, int Ev, C scale, int causal,
    float p, C keep_scale, unsigned long long seed, unsigned long long offset, long long tiles, T* out, C* lse,
    long long* rng_state) {
  __shared__ C ks[TILE][MAXD];
  __shared__ C vs[TILE][MAXD];
  __shared__ C st[TILE][TILE];
  const long long b = blockIdx.x / tiles, r0 = (blockIdx.x % tiles) * TILE;
  const int r = threadIdx.x / TILE, j = threadIdx.x % TILE;
  const long long row = r0 + r;
  const bool live = row < L;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    rng_state[0] = (long long)seed;
    rng_state[1] = (long long)offset;
  }
  C acc[MAXD / TILE];
  for (int c = 0; c < MAXD / TILE; ++c) acc[c] = (C)0;
  C m = neg_inf(), sum = (C)0;
  const long long key_end = causal ? min(S, r0 + TILE) : S;
  for (long long c0 = 0; c0 < key_end; c0 += TILE) {
    for (int i = threadIdx.x; i < TILE * MAXD; i += blockDim.x) {
      const int kr = i / MAXD, col = i % MAXD;
      const bool in = c0 + kr < S;
      if (col < E) ks[kr][col] = in ? (C)k[(b * S + c0 + kr) * E + col] : (C)0;
      if (col < Ev) vs[kr][col] = in ? (C)v[(b * S + c0 + kr) * Ev + col] : (C)0;
    }
    __syncthreads();
    C score = neg_inf();
    if (live && c0 + j < S) {
      C dot = (C)0;
      for (int e = 0; e < E; ++e) dot += (C)q[(b * L + row) * E + e] * ks[j][e];
      score = masked(dot * scale, b, row, c0 + j, causal, fmask, bmask, mask_base, mask_row, mask_col);
    }
    st[r][j] = score;
    __syncthreads();
    C tile_max = m;
    for (int jj = 0; jj < TILE; ++jj) tile_max = max(tile_max, st[r][jj]);
    const bool any = tile_max != neg_inf();  // the same for the row's 16 threads
    C s = (C)0;
    if (any)
      for (int jj = 0; jj < TILE; ++jj) s += exp(st[r][jj] - tile_max);
    __syncthreads();
    // The row's probabilities, dropped, replace its scores (each thread its own key's).
    if (any) st[r][j] = exp(score - tile_max) * drop_factor(b, row, c0 + j, L, S, p, keep_scale, seed, offset);
    __syncthreads();
    if (any) {
      const C rescale = exp(m - tile_max);
      sum = sum * rescale + s;
      m = tile_max;
      for (int c = 0; c < MAXD / TILE; ++c) {
        const int col = j + c * TILE;
        if (col >= Ev) break;
        C a = acc[c] * rescale;
        for (int jj = 0; jj < TILE; ++jj) a += st[r][jj] * vs[jj][col];
        acc[c] = a;
      }
    }
    __syncthreads();
  }
  if (!live) return;
  const C inv = sum > (C)0 ? (C)1 / sum : (C)0;
  for (int c = 0; c < MAXD / TILE; ++c) {
    const int col = j + c * TILE;
    if (col < Ev) out[(b * L + row) * Ev + col] = T(acc[c] * inv);
  }
  if (j == 0) lse[b * L + row] = sum > (C)0 ? m + log(sum) : neg_inf();
}
)",
                            kFloatDTypes);

// grad_q: a block per 16 queries. g and o [B, L, Ev]; dq [B, L, E].
const KernelFamily kBackwardQuery("attention_backward_query", std::string(kCommon) + R"(
extern "C" __global__ void __launch_bounds__(256) NAME(
    const T* g, const T* q, const T* k, const T* v, const T* o, const C* lse, const C* fmask, const bool* bmask,
    const long long* mask_base, long long mask_row, long long mask_col, long long L, long long S, int E, int Ev,
    C scale, int causal, float p, C keep_scale, const long long* rng_state, long long tiles, T* dq) {
  const unsigned long long seed = (unsigned long long)rng_state[0], offset = (unsigned long long)rng_state[1];
  __shared__ C ks[TILE][MAXD];
  __shared__ C vs[TILE][MAXD];
  __shared__ C st[TILE][TILE];
  const long long b = blockIdx.x / tiles, r0 = (blockIdx.x % tiles) * TILE;
  const int r = threadIdx.x / TILE, j = threadIdx.x % TILE;
  const long long row = r0 + r;
  const bool live = row < L;
  C acc[MAXD / TILE];
  for (int c = 0; c < MAXD / TILE; ++c) acc[c] = (C)0;
  C d = (C)0, l = neg_inf();
  if (live) {
    for (int e = 0; e < Ev; ++e) d += (C)g[(b * L + row) * Ev + e] * (C)o[(b * L + row) * Ev + e];
    l = lse[b * L + row];
  }
  const long long key_end = causal ? min(S, r0 + TILE) : S;
  for (long long c0 = 0; c0 < key_end; c0 += TILE) {
    for (int i = threadIdx.x; i < TILE * MAXD; i += blockDim.x) {
      const int kr = i / MAXD, col = i % MAXD;
      const bool in = c0 + kr < S;
      if (col < E) ks[kr][col] = in ? (C)k[(b * S + c0 + kr) * E + col] : (C)0;
      if (col < Ev) vs[kr][col] = in ? (C)v[(b * S + c0 + kr) * Ev + col] : (C)0;
    }
    __syncthreads();
    C ds = (C)0;
    if (live && c0 + j < S && l != neg_inf()) {
      C dot = (C)0;
      for (int e = 0; e < E; ++e) dot += (C)q[(b * L + row) * E + e] * ks[j][e];
      const C score = masked(dot * scale, b, row, c0 + j, causal, fmask, bmask, mask_base, mask_row, mask_col);
      const C prob = exp(score - l);
      C dp = (C)0;
      for (int e = 0; e < Ev; ++e) dp += (C)g[(b * L + row) * Ev + e] * vs[j][e];
      ds = prob * (dp * drop_factor(b, row, c0 + j, L, S, p, keep_scale, seed, offset) - d);
    }
    st[r][j] = ds;
    __syncthreads();
    for (int c = 0; c < MAXD / TILE; ++c) {
      const int col = j + c * TILE;
      if (col >= E) break;
      C a = (C)0;
      for (int jj = 0; jj < TILE; ++jj) a += st[r][jj] * ks[jj][col];
      acc[c] += a * scale;
    }
    __syncthreads();
  }
  if (!live) return;
  for (int c = 0; c < MAXD / TILE; ++c) {
    const int col = j + c * TILE;
    if (col < E) dq[(b * L + row) * E + col] = T(acc[c]);
  }
}
)",
                                  kFloatDTypes);

// grad_k and grad_v: a block per 16 keys; thread (kk, i) = (tid / 16, tid % 16) pairs key
// kk with query i of each query tile.
const KernelFamily kBackwardKey("attention_backward_key", std::string(kCommon) + R"(
extern "C" __global__ void __launch_bounds__(256) NAME(
    const T* g, const T* q, const T* k, const T* v, const T* o, const C* lse, const C* fmask, const bool* bmask,
    const long long* mask_base, long long mask_row, long long mask_col, long long L, long long S, int E, int Ev,
    C scale, int causal, float p, C keep_scale, const long long* rng_state, long long tiles, T* dk, T* dv) {
  const unsigned long long seed = (unsigned long long)rng_state[0], offset = (unsigned long long)rng_state[1];
  __shared__ C qs[TILE][MAXD];
  __shared__ C gs[TILE][MAXD];
  __shared__ C pt[TILE][TILE];
  __shared__ C st[TILE][TILE];
  __shared__ C ls[TILE];
  __shared__ C dd[TILE];
  const long long b = blockIdx.x / tiles, c0 = (blockIdx.x % tiles) * TILE;
  const int kk = threadIdx.x / TILE, i = threadIdx.x % TILE;
  const long long key = c0 + kk;
  const bool live = key < S;
  C acc_k[MAXD / TILE], acc_v[MAXD / TILE];
  for (int c = 0; c < MAXD / TILE; ++c) acc_k[c] = acc_v[c] = (C)0;
  const long long first = causal ? c0 / TILE * TILE : 0;
  for (long long r0 = first; r0 < L; r0 += TILE) {
    for (int x = threadIdx.x; x < TILE * MAXD; x += blockDim.x) {
      const int qr = x / MAXD, col = x % MAXD;
      const bool in = r0 + qr < L;
      if (col < E) qs[qr][col] = in ? (C)q[(b * L + r0 + qr) * E + col] : (C)0;
      if (col < Ev) gs[qr][col] = in ? (C)g[(b * L + r0 + qr) * Ev + col] : (C)0;
    }
    if (threadIdx.x < TILE) {
      const long long row = r0 + threadIdx.x;
      C d = (C)0;
      if (row < L)
        for (int e = 0; e < Ev; ++e) d += (C)g[(b * L + row) * Ev + e] * (C)o[(b * L + row) * Ev + e];
      dd[threadIdx.x] = d;
      ls[threadIdx.x] = row < L ? lse[b * L + row] : neg_inf();
    }
    __syncthreads();
    const long long row = r0 + i;
    C prob = (C)0, ds = (C)0;
    if (live && row < L && ls[i] != neg_inf()) {
      C dot = (C)0;
      for (int e = 0; e < E; ++e) dot += qs[i][e] * (C)k[(b * S + key) * E + e];
      const C score = masked(dot * scale, b, row, key, causal, fmask, bmask, mask_base, mask_row, mask_col);
      const C pr = exp(score - ls[i]);
      C dp = (C)0;
      for (int e = 0; e < Ev; ++e) dp += gs[i][e] * (C)v[(b * S + key) * Ev + e];
      const C z = drop_factor(b, row, key, L, S, p, keep_scale, seed, offset);
      prob = pr * z;
      ds = pr * (dp * z - dd[i]);
    }
    pt[kk][i] = prob;
    st[kk][i] = ds;
    __syncthreads();
    for (int c = 0; c < MAXD / TILE; ++c) {
      const int col = i + c * TILE;
      if (col < Ev) {
        C a = (C)0;
        for (int x = 0; x < TILE; ++x) a += pt[kk][x] * gs[x][col];
        acc_v[c] += a;
      }
      if (col < E) {
        C a = (C)0;
        for (int x = 0; x < TILE; ++x) a += st[kk][x] * qs[x][col];
        acc_k[c] += a * scale;
      }
    }
    __syncthreads();
  }
  if (!live) return;
  for (int c = 0; c < MAXD / TILE; ++c) {
    const int col = i + c * TILE;
    if (col < E) dk[(b * S + key) * E + col] = T(acc_k[c]);
    if (col < Ev) dv[(b * S + key) * Ev + col] = T(acc_v[c]);
  }
}
)",
                                kFloatDTypes);

// The sizes of a call and its mask as the kernels take them.
struct Problem {
  const char* op;
  int64_t batch = 1, L = 0, S = 0, E = 0, Ev = 0;
  Tensor fmask, bmask, mask_base;  // the mask broadcast to [..., L, S]; its heads' offsets
  int64_t mask_row = 0, mask_col = 0;

  Problem(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask)
      : op(op) {
    L = q.size(-2);
    S = k.size(-2);
    E = q.size(-1);
    Ev = v.size(-1);
    for (int64_t d = 0; d + 2 < q.dim(); ++d) batch *= q.size(d);
    KILN_CHECK(E <= kMaxDim && Ev <= kMaxDim,
               "{}: the CUDA kernel takes head dims up to {}, got E = {} and Ev = {} ({}, {}, {})",
               op, kMaxDim, E, Ev, q.meta_str(), k.meta_str(), v.meta_str());
    if (!mask.defined()) return;
    Shape full = q.shape();
    full.back() = S;
    const DType compute = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const Tensor m = mask.dtype() == DType::boolean ? mask.broadcast_to(full)
                                                    : mask.to(compute).broadcast_to(full);
    (mask.dtype() == DType::boolean ? bmask : fmask) = m;
    std::vector<int64_t> base(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      int64_t rest = b, off = 0;
      for (int64_t d = m.dim() - 2; d-- > 0;) {
        off += (rest % m.size(d)) * m.stride(d);
        rest /= m.size(d);
      }
      base[static_cast<size_t>(b)] = off;
    }
    mask_base = from_vector<int64_t>(base).to(q.device());
    mask_row = m.stride(-2);
    mask_col = m.stride(-1);
  }
  void* fmask_ptr() const { return fmask.defined() ? fmask.data_ptr() : nullptr; }
  void* bmask_ptr() const { return bmask.defined() ? bmask.data_ptr() : nullptr; }
  void* base_ptr() const { return mask_base.defined() ? mask_base.data_ptr() : nullptr; }
  long long tiles(int64_t n) const { return (n + kTile - 1) / kTile; }
};

// Launches `family` for `dtype` with the scale and keep factor in its compute type.
template <class... Before, class... After>
void launch(const KernelFamily& family, DType dtype, const Tensor& where, long long blocks,
            std::tuple<Before...> before, double scale, int causal, double p,
            std::tuple<After...> after) {
  const long long threads = blocks * KernelFamily::kBlock;
  auto go = [&]<class C>(C) {
    std::apply(
        [&](auto... b) {
          std::apply(
              [&](auto... a) {
                family.launch(dtype, where.device().index, threads, b..., static_cast<C>(scale),
                              causal, static_cast<float>(p), static_cast<C>(dropout_scale(p)),
                              a...);
              },
              after);
        },
        before);
  };
  if (dtype == DType::f64)
    go(double{});
  else
    go(float{});
}

void attention_forward(Span in, Span out, const Attrs& a) {
  const Tensor q = in[0].contiguous(), k = in[1].contiguous(), v = in[2].contiguous();
  const Problem pr("scaled_dot_product_attention", q, k, v, in[3]);
  if (pr.batch * pr.L == 0) {
    Tensor(out[2]).copy_(from_vector<int64_t>({a.i("seed"), a.i("offset")}));
    return;
  }
  const Contiguous o(out[0]), lse(out[1]);
  const long long tiles = pr.tiles(pr.L);
  launch(kForward, q.dtype(), q, pr.batch * tiles,
         std::tuple{q.data_ptr(), k.data_ptr(), v.data_ptr(), pr.fmask_ptr(), pr.bmask_ptr(),
                    pr.base_ptr(), static_cast<long long>(pr.mask_row),
                    static_cast<long long>(pr.mask_col), static_cast<long long>(pr.L),
                    static_cast<long long>(pr.S), static_cast<int>(pr.E), static_cast<int>(pr.Ev)},
         a.f("scale"), a.b("is_causal") ? 1 : 0, a.f("dropout_p"),
         std::tuple{static_cast<unsigned long long>(a.i("seed")),
                    static_cast<unsigned long long>(a.i("offset")), tiles, o.ptr(), lse.ptr(),
                    out[2].data_ptr()});
  o.finish();
  lse.finish();
}

void attention_backward(Span in, Span out, const Attrs& a) {
  const Tensor g = in[0].contiguous(), q = in[1].contiguous(), k = in[2].contiguous(),
               v = in[3].contiguous(), o = in[5].contiguous(), lse = in[6].contiguous();
  const Problem pr("scaled_dot_product_attention_backward", q, k, v, in[4]);
  const Tensor rng = in[7].contiguous();  // read by the kernels: no synchronization
  const Contiguous dq(out[0]), dk(out[1]), dv(out[2]);
  if (pr.batch * pr.L * pr.S == 0) {
    for (const Tensor& t : out) Tensor(t).zero_();
    return;
  }
  const auto common = std::tuple{g.data_ptr(),
                                 q.data_ptr(),
                                 k.data_ptr(),
                                 v.data_ptr(),
                                 o.data_ptr(),
                                 lse.data_ptr(),
                                 pr.fmask_ptr(),
                                 pr.bmask_ptr(),
                                 pr.base_ptr(),
                                 static_cast<long long>(pr.mask_row),
                                 static_cast<long long>(pr.mask_col),
                                 static_cast<long long>(pr.L),
                                 static_cast<long long>(pr.S),
                                 static_cast<int>(pr.E),
                                 static_cast<int>(pr.Ev)};
  const double scale = a.f("scale"), p = a.f("dropout_p");
  const int causal = a.b("is_causal") ? 1 : 0;
  const long long query_tiles = pr.tiles(pr.L), key_tiles = pr.tiles(pr.S);
  launch(kBackwardQuery, q.dtype(), q, pr.batch * query_tiles, common, scale, causal, p,
         std::tuple{rng.data_ptr(), query_tiles, dq.ptr()});
  launch(kBackwardKey, q.dtype(), q, pr.batch * key_tiles, common, scale, causal, p,
         std::tuple{rng.data_ptr(), key_tiles, dk.ptr(), dv.ptr()});
  dq.finish();
  dk.finish();
  dv.finish();
}

struct Registrar {
  Registrar() {
    register_kernel("scaled_dot_product_attention", DeviceType::cuda, attention_forward);
    register_kernel("scaled_dot_product_attention_backward", DeviceType::cuda, attention_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
