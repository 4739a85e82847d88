// CPU kernels of scaled_dot_product_attention and its backward (core/ops/attention.h):
// FlashAttention's algorithm (Dao et al., 2022; the backward as in FlashAttention-2). The
// scores are made one tile of kRows queries by kCols keys at a time with the GEMM of
// kernels/cpu/gemm.h; the forward keeps a running row maximum and sum (the online softmax)
// and rescales its output accumulator as the maximum grows, then saves the row
// log-sum-exp; the backward recomputes each tile's probabilities from it. Nothing of size
// L x S is ever held: besides the outputs, each thread has a few tiles, and the backward
// one row vector of size L per head (rowsum(grad_out * out)).
//
// Arithmetic is in C = f64 for f64 and f32 otherwise: f16 and bf16 inputs are converted to
// f32 first and the results rounded once as they are stored. The forward is parallel over
// (batch * heads, query tile), the backward over batch * heads (each thread owns its
// heads' gradients, so nothing is summed across threads).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/ops/dropout.h"
#include "core/philox.h"
#include "core/registry.h"
#include "kernels/cpu/row_max.h"
#include "kernels/cpu/exp_f32.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/philox_lanes.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// exp of scores shifted by their running max or log-sum-exp (<= 0): exp_f32 for f32, inline
// and branchless where expf is a libm call per score; libm's for f64.
template <class C>
inline C exp_shifted(C x) {
  if constexpr (std::is_same_v<C, float>) return exp_f32(x);
  else return std::exp(x);
}

constexpr int64_t kLanes = 16;  // partial sums and maxima per score row, so its loops vectorize

// The sum of a row of n scores over kLanes lanes, added up in a fixed order.
template <class C, int64_t kL>
__attribute__((always_inline)) inline C lane_sum(const C* x, int64_t n) {
  C lanes[kL] = {};
  int64_t k = 0;
  for (; k + kL <= n; k += kL)
    for (int64_t j = 0; j < kL; ++j) lanes[j] += x[k + j];
  for (; k < n; ++k) lanes[0] += x[k];
  C s = 0;
  for (int64_t j = 0; j < kL; ++j) s += lanes[j];
  return s;
}

constexpr int64_t kRows = 64;  // queries per tile
constexpr int64_t kCols = 64;  // keys per tile

// A [..., rows, cols] tensor seen as `batch` matrices: element (b, i, j) is at
// data + base[b] + i * row + j * col.
template <class T>
struct Matrices {
  const T* data = nullptr;
  std::vector<int64_t> base;
  int64_t row = 0, col = 0;
  const T* at(int64_t b, int64_t i) const { return data + base[static_cast<size_t>(b)] + i * row; }
};

// The matrices of t (converted to T), with a unit column stride unless `any_col` (the
// mask, read element by element, keeps whatever strides it has, broadcast ones included).
template <class T>
Matrices<T> matrices_of(Tensor& t, int64_t batch, bool any_col = false) {
  if (t.dtype() != dtype_v<T>) t = t.to(dtype_v<T>);
  if (!any_col && t.stride(-1) != 1) t = t.contiguous();
  Matrices<T> m{t.data_ptr<T>(), std::vector<int64_t>(static_cast<size_t>(batch)), t.stride(-2),
                t.stride(-1)};
  const int64_t nd = t.dim() - 2;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t rest = b, offset = 0;
    for (int64_t d = nd; d-- > 0;) {
      offset += (rest % t.size(d)) * t.stride(d);
      rest /= t.size(d);
    }
    m.base[static_cast<size_t>(b)] = offset;
  }
  return m;
}

// What one call computes: the sizes, the mask and the dropout rule.
template <class C>
struct Problem {
  int64_t batch = 1, L = 0, S = 0, E = 0, Ev = 0;
  C scale = 1;
  bool causal = false;
  Matrices<bool> bool_mask;  // data null when absent
  Matrices<C> float_mask;
  double p = 0;  // dropout
  uint64_t seed = 0, offset = 0;
  C keep_scale = 1;

  Problem(Span in, const Attrs& attrs, Tensor& bool_t, Tensor& float_t) {
    const bool fwd = in.size() == 4;  // forward: (q, k, v, mask?); backward: grad_out first
    const Tensor& q = in[fwd ? 0 : 1];
    const Tensor& k = in[fwd ? 1 : 2];
    const Tensor& v = in[fwd ? 2 : 3];
    const Tensor& mask = in[fwd ? 3 : 4];
    L = q.size(-2);
    S = k.size(-2);
    E = q.size(-1);
    Ev = v.size(-1);
    for (int64_t d = 0; d + 2 < q.dim(); ++d) batch *= q.size(d);
    scale = static_cast<C>(attrs.f("scale"));
    causal = attrs.b("is_causal");
    p = attrs.f("dropout_p");
    keep_scale = static_cast<C>(dropout_scale(p));
    if (mask.defined()) {
      Shape full = q.shape();
      full.back() = S;
      if (mask.dtype() == DType::boolean) {
        bool_t = mask.broadcast_to(full);
        bool_mask = matrices_of<bool>(bool_t, batch, true);
      } else {
        float_t = mask.to(dtype_v<C>).broadcast_to(full);
        float_mask = matrices_of<C>(float_t, batch, true);
      }
    }
  }

  // Scores tile st [nr x nc] (rows kCols apart) of queries r0.. and keys c0.. of head b:
  // masked entries become -inf, float masks are added.
  void mask_tile(C* st, int64_t b, int64_t r0, int64_t nr, int64_t c0, int64_t nc) const {
    constexpr C kNegInf = -std::numeric_limits<C>::infinity();
    for (int64_t i = 0; i < nr; ++i) {
      C* row = st + i * kCols;
      if (causal)
        for (int64_t j = std::max<int64_t>(0, r0 + i + 1 - c0); j < nc; ++j) row[j] = kNegInf;
      if (bool_mask.data) {
        const bool* m = bool_mask.at(b, r0 + i) + c0 * bool_mask.col;
        for (int64_t j = 0; j < nc; ++j)
          if (!m[j * bool_mask.col]) row[j] = kNegInf;
      } else if (float_mask.data) {
        const C* m = float_mask.at(b, r0 + i) + c0 * float_mask.col;
        for (int64_t j = 0; j < nc; ++j) row[j] += m[j * float_mask.col];
      }
    }
  }

  // The dropout factor of probability (b, l, s): keep_scale or 0.
  // The dropout factors (keep_scale or 0) of query l's keys s0 .. s0 + n - 1, into z:
  // philox's keep test for their counters, kPhiloxLanes at a time.
  void keep_row(int64_t b, int64_t l, int64_t s0, int64_t n, C* z) const {
    const auto first = static_cast<uint64_t>((b * L + l) * S + s0);
    dropout_keep_values<C>(seed, offset, first, n, static_cast<float>(p), keep_scale, C(0), z);
  }
  // Keys of a causal tile of queries from r0 on that can take part: those before r0 + nr.
  int64_t key_end(int64_t r0, int64_t nr) const { return causal ? std::min(S, r0 + nr) : S; }
};

// A contiguous C-typed stand-in for an output of another dtype, copied in by finish().
template <class C>
Tensor c_target(const Tensor& out) {
  return out.dtype() == dtype_v<C> && out.is_contiguous()
             ? out
             : make_tensor(out.shape(), dtype_v<C>, out.device());
}
void finish(const Tensor& target, const Tensor& out) {
  if (!target.same(out)) Tensor(out).copy_(target);
}

template <class C>
void forward(Span in, Span out, const Attrs& attrs) {
  Tensor bool_t, float_t;
  Problem<C> pr(in, attrs, bool_t, float_t);
  pr.seed = static_cast<uint64_t>(attrs.i("seed"));
  pr.offset = static_cast<uint64_t>(attrs.i("offset"));
  int64_t* rng = out[2].data_ptr<int64_t>();
  rng[0] = attrs.i("seed");
  rng[1] = attrs.i("offset");
  const Tensor o = c_target<C>(out[0]), lse = c_target<C>(out[1]);
  if (pr.batch * pr.L == 0) return;
  Tensor q = in[0], k = in[1], v = in[2];
  const Matrices<C> mq = matrices_of<C>(q, pr.batch), mk = matrices_of<C>(k, pr.batch),
                    mv = matrices_of<C>(v, pr.batch);
  C* po = o.data_ptr<C>();
  C* plse = lse.data_ptr<C>();
  const int64_t L = pr.L, E = pr.E, Ev = pr.Ev, tiles = (L + kRows - 1) / kRows;
  parallel_for(pr.batch * tiles, 1, [&](int64_t begin, int64_t end) {
    constexpr C kNegInf = -std::numeric_limits<C>::infinity();
    std::vector<C> st(static_cast<size_t>(kRows * kCols)), acc(static_cast<size_t>(kRows * Ev)),
        max(kRows), sum(kRows), z(kCols);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / tiles, r0 = (task % tiles) * kRows, nr = std::min(kRows, L - r0);
      std::fill(acc.begin(), acc.end(), C(0));
      std::fill(max.begin(), max.end(), kNegInf);
      std::fill(sum.begin(), sum.end(), C(0));
      const int64_t key_end = pr.key_end(r0, nr);
      for (int64_t c0 = 0; c0 < key_end; c0 += kCols) {
        const int64_t nc = std::min(kCols, key_end - c0);
        // st = scale * q[r0:] k[c0:]^T
        gemm(false, true, nr, nc, E, pr.scale, mq.at(b, r0), mq.row, mk.at(b, c0), mk.row, C(0),
             st.data(), kCols);
        pr.mask_tile(st.data(), b, r0, nr, c0, nc);
        for (int64_t i = 0; i < nr; ++i) {
          C* row = st.data() + i * kCols;
          const C m = std::max(max[static_cast<size_t>(i)], row_max<C, kLanes>(row, nc));
          if (m == kNegInf) {  // every key so far masked: nothing to add
            std::fill_n(row, nc, C(0));
            continue;
          }
          const C rescale = exp_shifted(max[static_cast<size_t>(i)] - m);
          // The exponentials, their sum over kLanes lanes (fixed order), then the dropout
          // factors: three loops that vectorize, where one summing as it went ran scalar.
          for (int64_t j = 0; j < nc; ++j) row[j] = exp_shifted(row[j] - m);
          const C s = lane_sum<C, kLanes>(row, nc);
          if (pr.p > 0) {
            pr.keep_row(b, r0 + i, c0, nc, z.data());
            for (int64_t j = 0; j < nc; ++j) row[j] *= z[static_cast<size_t>(j)];
          }
          sum[static_cast<size_t>(i)] = sum[static_cast<size_t>(i)] * rescale + s;
          max[static_cast<size_t>(i)] = m;
          if (rescale != C(1))
            for (C *a = acc.data() + i * Ev, *e = a + Ev; a < e; ++a) *a *= rescale;
        }
        // acc += probabilities (unnormalized, dropped) @ v[c0:]
        gemm(false, false, nr, Ev, nc, C(1), st.data(), kCols, mv.at(b, c0), mv.row, C(1),
             acc.data(), Ev);
      }
      for (int64_t i = 0; i < nr; ++i) {
        const C s = sum[static_cast<size_t>(i)];
        const C inv = s > 0 ? C(1) / s : C(0);  // an all-masked row gives zeros
        C* dst = po + ((b * L) + r0 + i) * Ev;
        for (int64_t j = 0; j < Ev; ++j) dst[j] = acc[static_cast<size_t>(i * Ev + j)] * inv;
        plse[b * L + r0 + i] = s > 0 ? max[static_cast<size_t>(i)] + std::log(s) : kNegInf;
      }
    }
  });
  finish(o, out[0]);
  finish(lse, out[1]);
}

// (grad_out, q, k, v, mask?, out, logsumexp, rng_state) -> (grad_q, grad_k, grad_v), with
// P = exp(scores - lse), Z the dropout factors, dP = (grad_out v^T) * Z and
// D = rowsum(grad_out * out) = rowsum(P * dP):
//   grad_v = (P * Z)^T grad_out,  dS = P * (dP - D),
//   grad_q = scale * dS k,        grad_k = scale * dS^T q.
template <class C>
void backward(Span in, Span out, const Attrs& attrs) {
  Tensor bool_t, float_t;
  Problem<C> pr(in, attrs, bool_t, float_t);
  const int64_t* rng = in[7].data_ptr<int64_t>();
  pr.seed = static_cast<uint64_t>(rng[0]);
  pr.offset = static_cast<uint64_t>(rng[1]);
  const Tensor dq = c_target<C>(out[0]), dk = c_target<C>(out[1]), dv = c_target<C>(out[2]);
  const int64_t L = pr.L, S = pr.S, E = pr.E, Ev = pr.Ev;
  Tensor(dq).zero_();
  Tensor(dk).zero_();
  Tensor(dv).zero_();
  if (pr.batch * L * S == 0) {
    finish(dq, out[0]);
    finish(dk, out[1]);
    finish(dv, out[2]);
    return;
  }
  Tensor g = in[0], q = in[1], k = in[2], v = in[3], o = in[5], lse = in[6];
  const Matrices<C> mg = matrices_of<C>(g, pr.batch), mq = matrices_of<C>(q, pr.batch),
                    mk = matrices_of<C>(k, pr.batch), mv = matrices_of<C>(v, pr.batch),
                    mo = matrices_of<C>(o, pr.batch);
  lse = lse.to(dtype_v<C>).contiguous();
  const C* plse = lse.data_ptr<C>();
  C *pdq = dq.data_ptr<C>(), *pdk = dk.data_ptr<C>(), *pdv = dv.data_ptr<C>();
  parallel_for(pr.batch, 1, [&](int64_t begin, int64_t end) {
    constexpr C kNegInf = -std::numeric_limits<C>::infinity();
    std::vector<C> prob(static_cast<size_t>(kRows * kCols)), dp(static_cast<size_t>(kRows * kCols)),
        delta(static_cast<size_t>(L)), zr(kCols);
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t i = 0; i < L; ++i) {
        const C *gi = mg.at(b, i), *oi = mo.at(b, i);
        C d = 0;
        for (int64_t j = 0; j < Ev; ++j) d += gi[j] * oi[j];
        delta[static_cast<size_t>(i)] = d;
      }
      C* dq_b = pdq + b * L * E;
      for (int64_t c0 = 0; c0 < S; c0 += kCols) {
        const int64_t nc = std::min(kCols, S - c0);
        C* dk_c = pdk + (b * S + c0) * E;
        C* dv_c = pdv + (b * S + c0) * Ev;
        // A causal tile takes part only from the query c0 on.
        const int64_t first = pr.causal ? (c0 / kRows) * kRows : 0;
        for (int64_t r0 = first; r0 < L; r0 += kRows) {
          const int64_t nr = std::min(kRows, L - r0);
          gemm(false, true, nr, nc, E, pr.scale, mq.at(b, r0), mq.row, mk.at(b, c0), mk.row, C(0),
               prob.data(), kCols);
          pr.mask_tile(prob.data(), b, r0, nr, c0, nc);
          // dp = grad_out[r0:] v[c0:]^T
          gemm(false, true, nr, nc, Ev, C(1), mg.at(b, r0), mg.row, mv.at(b, c0), mv.row, C(0),
               dp.data(), kCols);
          for (int64_t i = 0; i < nr; ++i) {
            C* pi = prob.data() + i * kCols;
            C* dpi = dp.data() + i * kCols;
            const C l = plse[b * L + r0 + i], d = delta[static_cast<size_t>(r0 + i)];
            if (pr.p > 0) pr.keep_row(b, r0 + i, c0, nc, zr.data());
            for (int64_t j = 0; j < nc; ++j) {
              const C pij = l == kNegInf ? C(0) : exp_shifted(pi[j] - l);
              const C z = pr.p > 0 ? zr[static_cast<size_t>(j)] : C(1);
              dpi[j] = pij * (dpi[j] * z - d);  // dS
              pi[j] = pij * z;                  // the dropped probabilities
            }
          }
          // grad_v[c0:] += (P * Z)^T grad_out[r0:]
          gemm(true, false, nc, Ev, nr, C(1), prob.data(), kCols, mg.at(b, r0), mg.row, C(1), dv_c,
               Ev);
          // grad_q[r0:] += scale * dS k[c0:];  grad_k[c0:] += scale * dS^T q[r0:]
          gemm(false, false, nr, E, nc, pr.scale, dp.data(), kCols, mk.at(b, c0), mk.row, C(1),
               dq_b + r0 * E, E);
          gemm(true, false, nc, E, nr, pr.scale, dp.data(), kCols, mq.at(b, r0), mq.row, C(1), dk_c,
               E);
        }
      }
    }
  });
  finish(dq, out[0]);
  finish(dk, out[1]);
  finish(dv, out[2]);
}

template <template <class> class F>
void by_compute_type(Span in, Span out, const Attrs& attrs) {
  const DType dtype = in[in.size() == 4 ? 0 : 1].dtype();
  if (dtype == DType::f64)
    F<double>::run(in, out, attrs);
  else
    F<float>::run(in, out, attrs);
}
template <class C>
struct Forward {
  static void run(Span in, Span out, const Attrs& a) { forward<C>(in, out, a); }
};
template <class C>
struct Backward {
  static void run(Span in, Span out, const Attrs& a) { backward<C>(in, out, a); }
};

const struct Registrar {
  Registrar() {
    register_kernel("scaled_dot_product_attention", DeviceType::cpu, by_compute_type<Forward>);
    register_kernel("scaled_dot_product_attention_backward", DeviceType::cpu,
                    by_compute_type<Backward>);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
