// CPU kernels of linear_cross_entropy and its backward op (core/ops/linear_cross_entropy.h).
//
// Forward: the counted rows (target != ignore_index) of the input are gathered, one GEMM
// gives their logits (into the `logits` workspace output, bias added), and one pass per row
// gives max, log(sum(exp)) (summed in f64, as the softmax kernels do), the row's loss
// lse - logit[target] and whether the first maximum is the target. The loss sums the rows'
// losses in f64, in row order.
// Backward: per counted row, G = scale * (softmax(logits) - onehot(target)), with
// scale = grad_loss (/ count for "mean"); grad_input's counted rows are G @ weight (the
// others zero), grad_weight = G^T @ rows, grad_bias = the column sums of G (in f64). So the
// three products run over the counted rows only, as the forward's did.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/registry.h"
#include "kernels/linear_cross_entropy_composed.h"
#include "kernels/cpu/exp_f32.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_max.h"
#include "kernels/cpu/wide.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// A scratch tensor: from the CPU block cache, so that a step's large temporaries (G is
// [R, V]) are not fresh pages at every call.
Tensor scratch(int64_t rows, int64_t cols, const Tensor& like) {
  return make_tensor({rows, cols}, like.dtype(), like.device());
}

// The counted rows of x ([M, H], contiguous) packed into [R, H]; x itself when every row counts.
template <class T>
const T* packed_rows(const Tensor& x, const std::vector<int64_t>& rows, Tensor& buffer) {
  const int64_t m = x.size(0), h = x.size(1), r_count = static_cast<int64_t>(rows.size());
  if (r_count == m) return x.data_ptr<T>();
  buffer = scratch(r_count, h, x);
  const T* px = x.data_ptr<T>();
  T* pb = buffer.data_ptr<T>();
  parallel_for(r_count, std::max<int64_t>(1, kGrain / std::max<int64_t>(h, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      std::memcpy(pb + r * h, px + rows[static_cast<size_t>(r)] * h, static_cast<size_t>(h) * sizeof(T));
  });
  return pb;
}

// c[R, V] = a[R, H] @ w[V, H]^T (zeros when H is 0: no GEMM is asked for an empty sum).
template <class T>
void product(const T* a, const T* w, T* c, int64_t r, int64_t v, int64_t h) {
  if (r == 0 || v == 0) return;
  if (h == 0) {
    std::fill_n(c, r * v, T(0));
    return;
  }
  gemm(false, true, r, v, h, T(1), a, h, w, h, T(0), c, v);
}

constexpr int64_t kVec = 16;  // partial sums per row, so the order of a sum is fixed

struct RowStats {
  double log_sum_exp = 0;
  int64_t argmax = 0;  // the first maximum; the first NaN when there is one (as argmax)
};

// max, log(sum(exp(x))) and the argmax of one row of n > 0 logits. exp is exp_f32 for f32
// (vectorizable), in f32 of x - max; the sum is in f64 over kVec lanes.
template <class T>
__attribute__((always_inline)) inline RowStats row_stats(const T* x, int64_t n) {
  const T max = row_max<T, kVec>(x, n);
  double acc[kVec] = {};
  int64_t k = 0;
  for (; k + kVec <= n; k += kVec)
    for (int64_t j = 0; j < kVec; ++j) {
      if constexpr (std::is_same_v<T, float>)
        acc[j] += static_cast<double>(exp_f32(x[k + j] - max));
      else
        acc[j] += scalar::exp(x[k + j] - max);
    }
  for (; k < n; ++k) {
    if constexpr (std::is_same_v<T, float>)
      acc[k % kVec] += static_cast<double>(exp_f32(x[k] - max));
    else
      acc[k % kVec] += scalar::exp(x[k] - max);
  }
  double sum = 0;
  for (int64_t j = 0; j < kVec; ++j) sum += acc[j];
  RowStats s;
  s.log_sum_exp = static_cast<double>(max) + std::log(sum);
  // A NaN never wins the max but makes the sum NaN: then the argmax is the first NaN.
  const bool any_nan = std::isnan(sum);
  for (k = 0; k < n; ++k)
    if (any_nan ? std::isnan(x[k]) : x[k] == max) break;
  s.argmax = k < n ? k : 0;
  return s;
}

// f() in the AVX-512 build where wide_loops() says so (the same bits), for the f32 rows.
template <class T, class F>
void plain_or_wide(F&& f) {
  if constexpr (std::is_same_v<T, float>)
    if (wide_loops()) return call_wide(f);
  f();
}

void forward(Span in, Span out, const Attrs& attrs) {
  const Tensor x = in[0].contiguous(), w = in[1].contiguous(), target = in[3].contiguous();
  const Tensor b = in[2].defined() ? in[2].contiguous() : Tensor();
  const int64_t m = x.size(0), h = x.size(1), v = w.size(0);
  const bool mean = attrs.str("reduction") == "mean";
  const std::vector<int64_t> rows =
      counted_rows(target, v, attrs.i("ignore_index"), "linear_cross_entropy", x);
  const int64_t r_count = static_cast<int64_t>(rows.size());
  const int64_t* t = target.data_ptr<int64_t>();
  double* lse = out[2].data_ptr<double>();
  std::fill_n(lse, m, 0.0);
  std::vector<double> row_loss(rows.size());
  std::vector<uint8_t> row_correct(rows.size());
  visit_floating(x.dtype(), "linear_cross_entropy", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      Tensor packed;
      const T* xa = packed_rows<T>(x, rows, packed);
      T* logits = out[3].data_ptr<T>();
      product(xa, w.data_ptr<T>(), logits, r_count, v, h);
      if (v == 0) return;
      const T* bias = b.defined() ? b.data_ptr<T>() : nullptr;
      parallel_for(r_count, std::max<int64_t>(1, kGrain / v), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          T* row = logits + r * v;
          const int64_t target_class = t[rows[static_cast<size_t>(r)]];
          RowStats s;
          plain_or_wide<T>([&]() __attribute__((always_inline)) {
            if (bias)
              for (int64_t k = 0; k < v; ++k) row[k] += bias[k];
            s = row_stats(row, v);
          });
          lse[rows[static_cast<size_t>(r)]] = s.log_sum_exp;
          row_loss[static_cast<size_t>(r)] = s.log_sum_exp - static_cast<double>(row[target_class]);
          row_correct[static_cast<size_t>(r)] = s.argmax == target_class;
        }
      });
    } else {
      fail("linear_cross_entropy: f32 and f64 only, got {}", x.meta_str());
    }
  });
  double total = 0;
  int64_t correct = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    total += row_loss[r];
    correct += row_correct[r];
  }
  if (mean) total = r_count ? total / static_cast<double>(r_count) : std::numeric_limits<double>::quiet_NaN();
  Tensor(out[0]).fill_(total);
  Tensor(out[1]).fill_(correct);
}

void backward(Span in, Span out, const Attrs& attrs) {
  const Tensor x = in[1].contiguous(), w = in[2].contiguous(), target = in[4].contiguous();
  const Tensor lse_t = in[5].contiguous(), logits_t = in[6].contiguous();
  const int64_t m = x.size(0), h = x.size(1), v = w.size(0);
  const std::vector<int64_t> rows =
      counted_rows(target, v, attrs.i("ignore_index"), "linear_cross_entropy_backward", x);
  const int64_t r_count = static_cast<int64_t>(rows.size());
  const int64_t* t = target.data_ptr<int64_t>();
  const double* lse = lse_t.data_ptr<double>();
  visit_floating(x.dtype(), "linear_cross_entropy_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* dx = out[0].data_ptr<T>();
      T* dw = out[1].data_ptr<T>();
      T* db = out[2].data_ptr<T>();
      // An ignored row's gradient is zero; with every row counted the GEMM writes all of dx.
      if (r_count < m) std::fill_n(dx, m * h, T(0));
      std::fill_n(db, v, T(0));
      if (r_count == 0 || v == 0) {
        std::fill_n(dw, v * h, T(0));
        return;
      }
      double scale = static_cast<double>(in[0].contiguous().data_ptr<T>()[0]);
      if (attrs.str("reduction") == "mean") scale /= static_cast<double>(r_count);
      const T s = static_cast<T>(scale);
      // G = s * softmax(logits) - s * onehot(target), row by row.
      const Tensor g_t = scratch(r_count, v, x);
      T* g = g_t.data_ptr<T>();
      const T* logits = logits_t.data_ptr<T>();
      parallel_for(r_count, std::max<int64_t>(1, kGrain / v), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* l = logits + r * v;
          T* gr = g + r * v;
          const T row_lse = static_cast<T>(lse[rows[static_cast<size_t>(r)]]);
          plain_or_wide<T>([&]() __attribute__((always_inline)) {
            for (int64_t k = 0; k < v; ++k) {
              if constexpr (std::is_same_v<T, float>)
                gr[k] = exp_f32(l[k] - row_lse) * s;
              else
                gr[k] = scalar::exp(l[k] - row_lse) * s;
            }
          });
          gr[t[rows[static_cast<size_t>(r)]]] -= s;
        }
      });
      Tensor packed;
      const T* xa = packed_rows<T>(x, rows, packed);
      if (h > 0) {
        // grad_input's counted rows (straight into dx when every row counts), then
        // grad_weight = G^T @ rows.
        const bool all_rows = r_count == m;
        const Tensor dxa_t = all_rows ? Tensor() : scratch(r_count, h, x);
        T* dxa = all_rows ? dx : dxa_t.data_ptr<T>();
        gemm(false, false, r_count, h, v, T(1), g, v, w.data_ptr<T>(), h, T(0), dxa, h);
        if (!all_rows)
          parallel_for(r_count, std::max<int64_t>(1, kGrain / h), [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r)
              std::memcpy(dx + rows[static_cast<size_t>(r)] * h, dxa + r * h, static_cast<size_t>(h) * sizeof(T));
          });
        gemm(true, false, v, h, r_count, T(1), g, v, xa, h, T(0), dw, h);
      }
      // grad_bias: column sums in f64, rows in order, a block of columns per task.
      constexpr int64_t kColumns = 256;
      const int64_t blocks = (v + kColumns - 1) / kColumns;
      parallel_for(blocks, std::max<int64_t>(1, kGrain / std::max<int64_t>(r_count * kColumns, 1)),
                   [&](int64_t begin, int64_t end) {
                     double acc[kColumns];
                     for (int64_t blk = begin; blk < end; ++blk) {
                       const int64_t c0 = blk * kColumns, nc = std::min(kColumns, v - c0);
                       std::fill_n(acc, nc, 0.0);
                       for (int64_t r = 0; r < r_count; ++r) {
                         const T* gr = g + r * v + c0;
                         for (int64_t c = 0; c < nc; ++c) acc[c] += static_cast<double>(gr[c]);
                       }
                       for (int64_t c = 0; c < nc; ++c) db[c0 + c] = static_cast<T>(acc[c]);
                     }
                   });
    } else {
      fail("linear_cross_entropy_backward: f32 and f64 only, got {}", x.meta_str());
    }
  });
}

struct Registrar {
  Registrar() {
    register_kernel("linear_cross_entropy", DeviceType::cpu, forward);
    register_kernel("linear_cross_entropy_backward", DeviceType::cpu, backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
