// The GEMMs of 16-bit float operands with f32 sums and an f32 C (kernels/cpu/gemm.h).
//
// bf16 on CPUs with AVX-512 BF16 is a GEMM of our own, in the usual blocked shape: a block
// of op(B) (kKc x kNc) and one of op(A) (kMs x kKc) are packed, by all the threads
// together, into panels of kNr columns and of kMr rows; then the threads share out the
// (kMc-row block, panel) pairs, and a micro-kernel keeps a kMr x kNr tile of C in
// registers across the block of k. Packing
// puts two consecutive k of a row (or column) side by side in 32 bits, the pair layout
// vdpbf16ps multiplies: lane i of the sum gains a[2i] b[2i] + a[2i+1] b[2i+1], each
// product of bf16 values exact in f32. Only the functions marked KILN_BF16_TARGET use
// AVX-512, and they run only after the run-time check, so the library stays portable.
//
// Debian's OpenBLAS has no sbgemm, so elsewhere (f16, and bf16 on other CPUs) the operands
// are converted to f32 a block of k at a time and handed to the f32 GEMM: no whole-tensor
// copies, and the f32 GEMM's speed.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_dnnl.h"
#include "kernels/cpu/parallel.h"

#define KILN_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace kiln::cpu {
namespace {

constexpr int64_t kMr = 8;     // rows of the C tile a micro-kernel call keeps in registers
constexpr int64_t kNr = 32;    // its columns: two vectors of 16 sums (16 accumulators in all)
constexpr int64_t kKc = 384;   // k of a packed block; even, so only a call's last block pads
constexpr int64_t kMc = 96;    // rows of A one work item covers (a multiple of kMr): 72 KiB
constexpr int64_t kNc = 1024;  // columns of a packed block of B (a multiple of kNr): 768 KiB
constexpr int64_t kMs = 1536;  // rows of A packed at once, shared by the threads: 1.1 MiB

bool detect_avx512_bf16() {
  __builtin_cpu_init();
  // GCC's check of an AVX-512 feature includes the OS's saving of the zmm registers.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}

const bool g_has_bf16 = detect_avx512_bf16();

Bf16GemmPath default_path() {
  if (dnnl_bf16_gemm_implementation().find("amx") != std::string::npos) return Bf16GemmPath::dnnl;
  return g_has_bf16 ? Bf16GemmPath::dot : Bf16GemmPath::convert;
}

// The path, chosen at the first bf16 GEMM (probing oneDNN makes a primitive, which no
// program should pay for as it loads); -1 until then.
std::atomic<int> g_path{-1};

Bf16GemmPath path_now() {
  int p = g_path.load(std::memory_order_relaxed);
  if (p < 0) {
    g_path.compare_exchange_strong(p, static_cast<int>(default_path()));
    p = g_path.load();
  }
  return static_cast<Bf16GemmPath>(p);
}

// An operand as GEMM gets it: 16-bit patterns stored with rows ld apart, op(X) = X or X^T.
struct Operand {
  const uint16_t* p;
  int64_t ld;
  bool trans;
};

inline uint32_t pair(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// dst [panels][kp][W]: the pairs (p0 + 2q, p0 + 2q + 1) of the lines (op(A)'s rows, op(B)'s
// columns) [l0, l0 + lines) and k [p0, p0 + kc), in panels [first, last) of W lines, zero
// past the last line and past k. k_contiguous: each line's k are adjacent in memory (A not
// transposed, B transposed), so its pairs are 32-bit loads; otherwise stored rows p and
// p + 1 are interleaved, read along the rows.
template <int64_t W>
KILN_BF16_TARGET void pack_pairs(const Operand& x, bool k_contiguous, int64_t l0, int64_t lines, int64_t p0,
                                 int64_t kc, int64_t first, int64_t last, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t panel = first; panel < last; ++panel) {
    uint32_t* out = dst + panel * kp * W;
    const int64_t live = std::min(W, lines - panel * W);
    const int64_t l = l0 + panel * W;
    if (live < W) std::fill(out, out + kp * W, 0u);
    if (k_contiguous) {
      for (int64_t i = 0; i < live; ++i) {
        const uint16_t* line = x.p + (l + i) * x.ld + p0;
        for (int64_t q = 0; q < kc / 2; ++q) {
          uint32_t v;
          std::memcpy(&v, line + 2 * q, sizeof v);
          out[q * W + i] = v;
        }
        if (kc % 2) out[(kp - 1) * W + i] = pair(line[kc - 1], 0);
      }
    } else {
      for (int64_t q = 0; q < kp; ++q) {
        const uint16_t* lo = x.p + (p0 + 2 * q) * x.ld + l;
        uint32_t* o = out + q * W;
        if (2 * q + 1 < kc)
          for (int64_t i = 0; i < live; ++i) o[i] = pair(lo[i], lo[i + x.ld]);
        else
          for (int64_t i = 0; i < live; ++i) o[i] = pair(lo[i], 0);
      }
    }
  }
}

// op(A)'s rows [r0, r0 + rows), all their panels.
KILN_BF16_TARGET void pack_a(const Operand& a, int64_t r0, int64_t rows, int64_t p0, int64_t kc,
                             uint32_t* dst) {
  pack_pairs<kMr>(a, !a.trans, r0, rows, p0, kc, 0, (rows + kMr - 1) / kMr, dst);
}

// op(B)'s columns [c0, c0 + cols), panels [first, last).
KILN_BF16_TARGET void pack_b(const Operand& b, int64_t p0, int64_t kc, int64_t c0, int64_t cols,
                             int64_t first, int64_t last, uint32_t* dst) {
  pack_pairs<kNr>(b, b.trans, c0, cols, p0, kc, first, last, dst);
}

// C[rows, cols] = alpha * (A panel @ B panel) + beta * C, for rows <= kMr and cols <= kNr;
// beta == 0 never reads C.
KILN_BF16_TARGET void micro_kernel(int64_t kp, const uint32_t* a, const uint32_t* b, float* c,
                                   int64_t ldc, int64_t rows, int64_t cols, float alpha,
                                   float beta) {
  __m512 acc[kMr][2];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kp; ++q) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + q * kNr));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + q * kNr + 16));
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512bh ai =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[q * kMr + i])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  const auto mask = [](int64_t n) -> __mmask16 {
    return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
  };
  const __mmask16 m0 = mask(cols), m1 = mask(cols - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    if (i >= rows) break;
    float* ci = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(acc[i][0], va), r1 = _mm512_mul_ps(acc[i][1], va);
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, ci), r0);
      r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, ci + 16), r1);
    }
    _mm512_mask_storeu_ps(ci, m0, r0);
    _mm512_mask_storeu_ps(ci + 16, m1, r1);
  }
}

// Buffers that outlive a call, so that the GEMMs a convolution makes per tile allocate
// (and fault in) their packing memory once per thread.
std::vector<uint32_t>& thread_buffer(int which) {
  thread_local std::vector<uint32_t> buffers[2];
  return buffers[which];
}

uint32_t* sized(std::vector<uint32_t>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The threads a product is worth: one inside a parallel region (a convolution's tiles),
// else one per 2^21 multiply-adds, at most all of them.
int threads_for(int64_t m, int64_t n, int64_t k) {
  if (omp_in_parallel()) return 1;
  const int64_t work = m * n * k >> 21;
  return static_cast<int>(std::clamp<int64_t>(work, 1, omp_get_max_threads()));
}

void dot_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  const Operand opa{a, lda, trans_a}, opb{b, ldb, trans_b};
  const int threads = threads_for(m, n, k);
  const int64_t kp_max = (std::min(k, kKc) + 1) / 2;
  const int64_t nc_max = (std::min(n, kNc) + kNr - 1) / kNr * kNr;
  const int64_t ms_max = (std::min(m, kMs) + kMr - 1) / kMr * kMr;
  uint32_t* packed_b = sized(thread_buffer(0), kp_max * nc_max);
  uint32_t* packed_a = sized(thread_buffer(1), kp_max * ms_max);
#pragma omp parallel num_threads(threads) if (threads > 1)
  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc), panels = (nc + kNr - 1) / kNr;
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc), kp = (kc + 1) / 2;
      const float beta_here = pc == 0 ? beta : 1.0f;  // later blocks add to the sum so far
#pragma omp for schedule(static)
      for (int64_t panel = 0; panel < panels; ++panel)
        pack_b(opb, pc, kc, jc, nc, panel, panel + 1, packed_b);
      for (int64_t is = 0; is < m; is += kMs) {
        const int64_t ms = std::min(kMs, m - is), row_panels = (ms + kMr - 1) / kMr;
        const int64_t row_blocks = (ms + kMc - 1) / kMc;
        // The barrier after it also ends the packing of B.
#pragma omp for schedule(static)
        for (int64_t rp = 0; rp < row_panels; ++rp)
          pack_a(opa, is + rp * kMr, std::min(kMr, ms - rp * kMr), pc, kc,
                 packed_a + rp * kMr * kp);
        // Contiguous runs of (row block, panel), row blocks outermost: each thread's share
        // is even to a panel, and it walks the panels of B with one block of A in cache.
#pragma omp for schedule(static)
        for (int64_t item = 0; item < row_blocks * panels; ++item) {
          const int64_t ic = item / panels * kMc, panel = item % panels;
          const int64_t ic_end = std::min(ms, ic + kMc);
          for (int64_t ir = ic; ir < ic_end; ir += kMr)
            micro_kernel(kp, packed_a + ir * kp, packed_b + panel * kp * kNr,
                         c + (is + ir) * ldc + jc + panel * kNr, ldc, std::min(kMr, ic_end - ir),
                         std::min(kNr, nc - panel * kNr), alpha, beta_here);
        }
      }
    }
  }
}

inline float to_float(BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float to_float(Half v) { return static_cast<float>(v); }

// Rows [r0, r1) and columns [c0, c1) of a stored matrix into a dense f32 block.
template <class T>
void convert_block(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   float* dst) {
  const int64_t cols = c1 - c0;
  parallel_for(r1 - r0, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols)),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) {
                   const T* s = src + (r0 + r) * ld + c0;
                   float* d = dst + r * cols;
                   for (int64_t j = 0; j < cols; ++j) d[j] = to_float(s[j]);
                 }
               });
}

// The f32 GEMM over blocks of k converted on the way: the f32 copies stay a bounded size
// whatever the operands' (kConvertK * (m + n) floats).
template <class T>
void convert_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  constexpr int64_t kConvertK = 1024;
  std::vector<float> fa(static_cast<size_t>(m * std::min(k, kConvertK)));
  std::vector<float> fb(static_cast<size_t>(n * std::min(k, kConvertK)));
  for (int64_t pc = 0; pc < k; pc += kConvertK) {
    const int64_t kc = std::min(kConvertK, k - pc);
    // Each block keeps its operand's orientation, so the f32 GEMM reads it the same way.
    if (trans_a)
      convert_block(a, lda, pc, pc + kc, 0, m, fa.data());
    else
      convert_block(a, lda, 0, m, pc, pc + kc, fa.data());
    if (trans_b)
      convert_block(b, ldb, 0, n, pc, pc + kc, fb.data());
    else
      convert_block(b, ldb, pc, pc + kc, 0, n, fb.data());
    gemm(trans_a, trans_b, m, n, kc, alpha, fa.data(), trans_a ? m : kc, fb.data(),
         trans_b ? kc : n, pc == 0 ? beta : 1.0f, c, ldc);
  }
}

// The checks and the empty cases of the f32 GEMM (kernels/cpu/gemm.cpp); true when done.
bool check_and_handle_empty(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            int64_t lda, int64_t ldb, float beta, float* c, int64_t ldc) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm (16-bit): negative size m={} n={} k={}", m, n, k);
  KILN_CHECK(lda >= std::max<int64_t>(1, trans_a ? m : k) &&
                 ldb >= std::max<int64_t>(1, trans_b ? k : n) && ldc >= std::max<int64_t>(1, n),
             "gemm (16-bit): leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={} "
             "(trans_a={}, trans_b={})",
             lda, ldb, ldc, m, n, k, trans_a, trans_b);
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return true;
  }
  return false;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  if (check_and_handle_empty(trans_a, trans_b, m, n, k, lda, ldb, beta, c, ldc)) return;
  const Bf16GemmPath path = path_now();
  if (path == Bf16GemmPath::dnnl &&
      dnnl_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  if (path == Bf16GemmPath::convert || !g_has_bf16)
    return convert_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  static_assert(sizeof(BFloat16) == sizeof(uint16_t));
  dot_gemm(trans_a, trans_b, m, n, k, alpha, reinterpret_cast<const uint16_t*>(a), lda,
           reinterpret_cast<const uint16_t*>(b), ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Half* a,
          int64_t lda, const Half* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (check_and_handle_empty(trans_a, trans_b, m, n, k, lda, ldb, beta, c, ldc)) return;
  convert_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_bf16_gemm_path(Bf16GemmPath path) {
  KILN_CHECK(path != Bf16GemmPath::dot || g_has_bf16,
             "set_bf16_gemm_path: this CPU has no AVX-512 BF16 (avx512_bf16), so bf16 GEMMs "
             "can only convert to f32");
  KILN_CHECK(path != Bf16GemmPath::dnnl || !dnnl_bf16_gemm_implementation().empty(),
             "set_bf16_gemm_path: oneDNN has no bf16 matmul kernel here (a build without "
             "oneDNN, or a CPU without AVX-512, or DNNL_MAX_CPU_ISA below it)");
  g_path.store(static_cast<int>(path));
}

Bf16GemmPath bf16_gemm_path() { return path_now(); }

std::vector<Bf16GemmPath> bf16_gemm_paths() {
  std::vector<Bf16GemmPath> paths;
  if (!dnnl_bf16_gemm_implementation().empty()) paths.push_back(Bf16GemmPath::dnnl);
  if (g_has_bf16) paths.push_back(Bf16GemmPath::dot);
  paths.push_back(Bf16GemmPath::convert);
  return paths;
}

const char* bf16_gemm_path_name(Bf16GemmPath path) {
  switch (path) {
    case Bf16GemmPath::dnnl: return "dnnl";
    case Bf16GemmPath::dot: return "dot";
    case Bf16GemmPath::convert: return "convert";
  }
  return "?";
}

bool cpu_has_avx512_bf16() { return g_has_bf16; }

}  // namespace kiln::cpu
