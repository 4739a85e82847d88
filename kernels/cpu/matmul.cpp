// CPU kernels of matmul, mm, bmm and addmm. Every product becomes a stack of GEMMs over
// strided views: an operand whose rows or columns are contiguous goes to GEMM as it is
// (transposed when its columns are), and only other layouts are copied. f16 and bf16
// operands go to GEMM as they are and sum into f32 (kernels/cpu/gemm.h).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/registry.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// How a rows x cols view with element strides (row_stride, col_stride) is handed to GEMM.
struct MatrixLayout {
  bool direct = false;  // false: the view must be copied first
  bool trans = false;   // stored as its transpose (contiguous columns)
  int64_t ld = 1;
};

MatrixLayout layout_of(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (rows == 0 || cols == 0) return {true, false, std::max<int64_t>(1, cols)};
  // Strides of size-1 dims are meaningless, so they never block the direct path.
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= std::max<int64_t>(1, cols)))
    return {true, false, rows == 1 ? std::max<int64_t>(1, cols) : row_stride};
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= std::max<int64_t>(1, rows)))
    return {true, true, cols == 1 ? std::max<int64_t>(1, rows) : col_stride};
  return {};
}

MatrixLayout layout_of(const Tensor& t) {
  const int64_t nd = t.dim();
  return layout_of(t.size(nd - 2), t.size(nd - 1), t.stride(nd - 2), t.stride(nd - 1));
}

// t itself when GEMM can read its matrices in place, else a contiguous copy.
Tensor gemm_ready(const Tensor& t) { return layout_of(t).direct ? t : t.contiguous(); }

// Integer products, exact with wrap-around: accumulated in 64-bit unsigned arithmetic
// (well defined on overflow) and truncated to T once.
template <class T>
void loop_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  auto wide = [](T v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); };
  std::vector<uint64_t> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0);
    for (int64_t p = 0; p < k; ++p) {
      const uint64_t av = wide(trans_a ? a[p * lda + i] : a[i * lda + p]);
      if (!trans_b) {
        const T* brow = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) acc[j] += av * wide(brow[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) acc[j] += av * wide(b[j * ldb + p]);
      }
    }
    T* crow = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) {
      uint64_t r = wide(alpha) * acc[j];
      if (beta != T(0)) r += wide(beta) * wide(crow[j]);
      crow[j] = static_cast<T>(r);
    }
  }
}

// Operands of type S (T, or a 16-bit float whose sums are T = float); C of type T.
template <class S, class T>
void product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const S* a,
             int64_t lda, const S* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_floating_point_v<T>)
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    loop_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Element offsets of every matrix of a stack, batch dims in row-major order.
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t batch) {
  const int64_t nb = t.dim() - 2;
  std::vector<int64_t> offsets(static_cast<size_t>(batch));
  std::vector<int64_t> idx(static_cast<size_t>(nb), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < batch; ++i) {
    offsets[i] = off;
    for (int64_t d = nb - 1; d >= 0; --d) {  // odometer step, adjusting the offset
      off += t.stride(d);
      if (++idx[d] < t.size(d)) break;
      off -= t.stride(d) * t.size(d);
      idx[d] = 0;
    }
  }
  return offsets;
}

// out[i] = alpha * a[i] @ b[i] + beta * out[i] for every matrix of the stacks a [..., m, k],
// b [..., k, n] and out [..., m, n] (same batch dims; a and b may broadcast with stride 0;
// out is contiguous of type T; a and b are gemm_ready, of type S).
template <class S, class T>
void stacked_product(const Tensor& a, const Tensor& b, const Tensor& out, T alpha, T beta) {
  const int64_t nd = out.dim();
  const int64_t m = out.size(nd - 2), n = out.size(nd - 1), k = a.size(nd - 1);
  const int64_t batch =
      out.numel() == 0 ? 0 : numel_of(Shape(out.shape().begin(), out.shape().end() - 2));
  if (batch == 0 || m == 0 || n == 0) return;
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  KILN_CHECK(la.direct && lb.direct, "matmul: internal error: operand layout not GEMM-ready");
  const int64_t ldc = std::max<int64_t>(1, n);
  const S* pa = static_cast<const S*>(a.data_ptr());
  const S* pb = static_cast<const S*>(b.data_ptr());
  T* pc = static_cast<T*>(out.data_ptr());
  if (batch == 1) {
    product(la.trans, lb.trans, m, n, k, alpha, pa, la.ld, pb, lb.ld, beta, pc, ldc);
    return;
  }
  const std::vector<int64_t> off_a = batch_offsets(a, batch), off_b = batch_offsets(b, batch);
  // A stack times one shared matrix whose rows follow on evenly: one tall GEMM (a Linear
  // layer on a [B, S, F] input, say).
  bool fold = !la.trans;
  for (int64_t i = 0; i < batch && fold; ++i) fold = off_b[i] == 0 && off_a[i] == i * m * la.ld;
  if (fold) {
    product(false, lb.trans, batch * m, n, k, alpha, pa, la.ld, pb, lb.ld, beta, pc, ldc);
    return;
  }
  // Small products, or at least one per thread: threads over the stack, one thread per GEMM.
  // Otherwise the GEMM itself uses the threads.
  const bool over_batch = batch >= omp_get_max_threads() || m * n * k < (int64_t{1} << 18) ||
                          !std::is_floating_point_v<T>;
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      product(la.trans, lb.trans, m, n, k, alpha, pa + off_a[i], la.ld, pb + off_b[i], lb.ld, beta,
              pc + i * m * n, ldc);
  };
  if (over_batch) {
    const int64_t grain =
        std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, m * n * k));
    parallel_for(batch, grain, run);
  } else {
    run(0, batch);
  }
}

// Calls f.template operator()<S, T>() with S the operands' type for dtype `t` and T the
// type their products are summed and stored in: f16 and bf16 operands go to the GEMM as
// they are (no f32 copies) and sum into f32, which is rounded once.
template <class F>
void visit_product_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float, float>();
    case DType::f16:
      return f.template operator()<Half, float>();
    case DType::bf16:
      return f.template operator()<BFloat16, float>();
    case DType::f64:
      return f.template operator()<double, double>();
    case DType::i64:
      return f.template operator()<int64_t, int64_t>();
    case DType::i32:
      return f.template operator()<int32_t, int32_t>();
    case DType::u8:
      return f.template operator()<uint8_t, uint8_t>();
    default:
      fail("{}: dtype {} is not supported", op, t);
  }
}

DType product_dtype(DType t) { return is_reduced_float(t) ? DType::f32 : t; }

// matmul, mm and bmm: the rule already checked the shapes, so one kernel serves all three.
void matmul_kernel(Span in, Span out, const Attrs&) {
  const DType s = in[0].dtype(), c = product_dtype(s);
  Tensor a = in[0], b = as_dtype(in[1], s);
  if (a.dim() == 1) a = a.unsqueeze(0);
  if (b.dim() == 1) b = b.unsqueeze(1);
  a = gemm_ready(a);
  b = gemm_ready(b);
  const Shape shapes[] = {Shape(a.shape().begin(), a.shape().end() - 2),
                          Shape(b.shape().begin(), b.shape().end() - 2)};
  Shape batch = broadcast_shapes(shapes, "matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  a = a.expand(a_shape);
  b = b.expand(b_shape);
  into_contiguous(out[0], c, [&](const Tensor& o) {
    visit_product_type(s, "matmul", [&]<class S, class T>() {
      stacked_product<S, T>(a, b, o.view(out_shape), T(1), T(0));
    });
  });
}

void addmm_kernel(Span in, Span out, const Attrs& attrs) {
  const DType s = in[1].dtype(), c = product_dtype(s);
  const Tensor a = gemm_ready(in[1]), b = gemm_ready(as_dtype(in[2], s));
  const Scalar beta = attrs.has("beta") ? attrs.scalar("beta") : Scalar(1);
  const Scalar alpha = attrs.has("alpha") ? attrs.scalar("alpha") : Scalar(1);
  into_contiguous(out[0], c, [&](const Tensor& o) {
    visit_product_type(s, "addmm", [&]<class S, class T>() {
      const T beta_v = beta.to<T>();
      // The bias, broadcast (beta == 0 never reads it); already there when the program
      // accumulates into it in place (the compiler's gemm_epilogues).
      if (beta_v != T(0) && !same_view(o, in[0])) Tensor(o).copy_(in[0]);
      stacked_product<S, T>(a, b, o, alpha.to<T>(), beta_v);
    });
  });
}

struct Registrar {
  Registrar() {
    register_kernel("matmul", DeviceType::cpu, matmul_kernel);
    register_kernel("mm", DeviceType::cpu, matmul_kernel);
    register_kernel("bmm", DeviceType::cpu, matmul_kernel);
    register_kernel("addmm", DeviceType::cpu, addmm_kernel);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
