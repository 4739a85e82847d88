// CUDA kernels of gather, scatter_add, sort, topk, index_select, embedding (+ backward), one_hot, flip, tril and triu,
// with kernels/cpu/indexing.cpp's semantics. The copying kernels move elements as values of
// a type of their size (bit for bit, NaN payloads included), so one kernel per element size
// serves every dtype; their results equal the CPU's exactly.
// - gather: out has the index's shape, out[c] = x[c with c[dim] replaced by index[c]]; the
//   input may be strided, the index is made contiguous.
// - scatter_add: out = x, then a thread per line of the index along dim adds its src
//   elements in order into out's line (the CPU's order: equal results, deterministic);
// - index_select / embedding: x seen as [outer, size, inner], out[o][j][:] = x[o][index[j]][:].
// - embedding_backward: the CPU's threads own columns and add the gradient rows in index
//   order; here a thread owns a column of the weight rows q with q % groups == its group and
//   walks the indices in order, so every sum has the CPU's order (exact, deterministic)
//   with width * groups threads. 16-bit floats accumulate in f32 and round once at the end.
// - sort / topk: a block per line sorts (value, position) pairs in shared memory by the
//   CPU's order (NaN largest, ties by position): the CPU's permutation exactly; lines longer
//   than 4096 elements go through the host fallback;
// - one_hot writes i64 rows; flip reads a strided input with the flipped dims reversed;
//   tril/triu copy or zero each element of a contiguous input.
//
// Unlike the CPU kernels, an index out of range raises no error (finding it would make
// every call wait for the GPU): gather, index_select and embedding give zero bits for that
// element or row, scatter_add and embedding_backward skip the element or row, and one_hot
// gives a row of zeros.
#include <algorithm>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr int kMaxDims = 8;

// The index's sizes and x's element strides, passed by value.
struct GatherDims {
  long long size[kMaxDims];
  long long x_stride[kMaxDims];
};

// The element types of the copying kernels, one per element size: u8, f16 (kiln::Half, a
// 2-byte struct), i32, i64.
const std::vector<DType> kBySize = {DType::u8, DType::f16, DType::i32, DType::i64};

// SCALAR is an integer type of the element's size: u8, f16 (kiln::Half, a 2-byte struct),
// i32, i64.
const KernelFamily kGather("gather", R"(
typedef SCALAR T;
struct GatherDims {
  long long size[8];
  long long x_stride[8];
};
extern "C" __global__ void NAME(const T* x, const long long* index, T* out, long long total, int ndim, int dim,
                                long long dim_size, GatherDims dims) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long k = index[j];
  if (k < 0 || k >= dim_size) {
    out[j] = T{};
    return;
  }
  long long rest = j, offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const long long c = rest % dims.size[d];
    rest /= dims.size[d];
    offset += (d == dim ? k : c) * dims.x_stride[d];
  }
  out[j] = x[offset];
}
)",
                            kBySize);

DType by_size(size_t bytes) {
  switch (bytes) {
    case 1: return DType::u8;
    case 2: return DType::f16;
    case 4: return DType::i32;
    default: return DType::i64;
  }
}

// A 0-d tensor as a 1-d tensor of one element, as the CPU kernel sees it.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// scatter_add: one thread per line of the index along dim, adding its src elements into
// out's line in order, as the CPU does (each index line writes only to the out line with its
// own coordinates), so every sum has the CPU's order and result.
struct ScatterDims {
  long long size[kMaxDims];  // the index's
  long long out_stride[kMaxDims], src_stride[kMaxDims], index_stride[kMaxDims];
};
const KernelFamily kScatterAdd("scatter_add", R"(
typedef SCALAR T;
typedef COMPUTE C;
struct ScatterDims {
  long long size[8];
  long long out_stride[8], src_stride[8], index_stride[8];
};
template <class X> __device__ X add_values(X a, X b) { return a + b; }
__device__ bool add_values(bool a, bool b) { return a || b; }
extern "C" __global__ void NAME(T* out, const T* src, const long long* index, long long lines, int ndim, int dim,
                                long long dim_size, ScatterDims dims) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= lines) return;
  long long rest = t, o = 0, s = 0, i = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    if (d == dim) continue;
    const long long c = rest % dims.size[d];
    rest /= dims.size[d];
    o += c * dims.out_stride[d];
    s += c * dims.src_stride[d];
    i += c * dims.index_stride[d];
  }
  for (long long j = 0; j < dims.size[dim]; ++j) {
    const long long k = index[i + j * dims.index_stride[dim]];
    if (k < 0 || k >= dim_size) continue;
    T& dst = out[o + k * dims.out_stride[dim]];
    dst = T(add_values((C)dst, (C)src[s + j * dims.src_stride[dim]]));
  }
}
)",
                                 {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8,
                                  DType::boolean});

void scatter_add(Span in, Span out, const Attrs& a) {
  constexpr const char* op = "scatter_add";
  const Tensor o = at_least_1d(out[0]);
  const Tensor x = at_least_1d(in[0]);
  if (!same_view(o, x)) Tensor(o).copy_(x);
  const Tensor index = at_least_1d(in[1]), src = at_least_1d(in[2]);
  const int64_t dim = wrap_dim(a.i("dim"), o.dim(), op);
  if (index.numel() == 0) return;
  KILN_CHECK(o.dim() <= kMaxDims, "{}: on CUDA at most {} dims are supported, got {}", op, kMaxDims, o.meta_str());
  ScatterDims dims{};
  for (int64_t d = 0; d < o.dim(); ++d) {
    dims.size[d] = index.size(d);
    dims.out_stride[d] = o.stride(d);
    dims.src_stride[d] = src.stride(d);
    dims.index_stride[d] = index.stride(d);
  }
  const long long lines = index.numel() / index.size(dim);
  kScatterAdd.launch(o.dtype(), o.device().index, lines, o.data_ptr(), src.data_ptr(), index.data_ptr(), lines,
                     static_cast<int>(o.dim()), static_cast<int>(dim), static_cast<long long>(o.size(dim)), dims);
}

// sort / topk: one block per line along dim sorts (value, position) pairs in shared memory
// with a bitonic network under the CPU's order (NaN largest, ties by position), a strict
// total order, so the permutation is the CPU's stable one exactly; the first k are written.
// Lines longer than kSortMax run through the host fallback.
constexpr long long kSortMax = 4096;
const KernelFamily kSortLines("sort_lines", R"(
typedef SCALAR T;
typedef COMPUTE C;
__device__ bool before(C u, int i, C v, int j, int n, bool descending) {
  if (i >= n || j >= n) return i < j;  // padding goes last
  const bool u_nan = u != u, v_nan = v != v;
  if (u_nan != v_nan) return descending ? u_nan : v_nan;
  if (!u_nan && u != v) return descending ? u > v : u < v;
  return i < j;
}
extern "C" __global__ void NAME(const T* x, long long size, long long inner, long long k, int padded, int descending,
                                T* values, long long* indices) {
  __shared__ C key[4096];
  __shared__ int pos[4096];
  const long long slice = blockIdx.x / inner, col = blockIdx.x % inner;
  const T* s = x + slice * size * inner + col;
  const int n = (int)size;
  for (int j = threadIdx.x; j < padded; j += blockDim.x) {
    pos[j] = j;
    key[j] = j < n ? (C)s[j * inner] : C(0);
  }
  __syncthreads();
  for (int width = 2; width <= padded; width <<= 1)
    for (int step = width >> 1; step > 0; step >>= 1) {
      for (int a = threadIdx.x; a < padded; a += blockDim.x) {
        const int b = a ^ step;
        if (b <= a) continue;
        // Ascending runs where (a & width) == 0: the earlier pair element must come first.
        const bool swap = (a & width) == 0 ? before(key[b], pos[b], key[a], pos[a], n, descending)
                                           : before(key[a], pos[a], key[b], pos[b], n, descending);
        if (swap) {
          const C kv = key[a];
          key[a] = key[b];
          key[b] = kv;
          const int pv = pos[a];
          pos[a] = pos[b];
          pos[b] = pv;
        }
      }
      __syncthreads();
    }
  T* dv = values + slice * k * inner + col;
  long long* di = indices + slice * k * inner + col;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    dv[j * inner] = s[pos[j] * inner];
    di[j * inner] = pos[j];
  }
}
)",
                                {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8,
                                 DType::boolean});

// The first k of each line of in along dim, ordered (descending: largest first), with their
// positions, into values and indices.
void sorted_lines(const OpDef& op, Span in, Span out, const Attrs& a, long long k, bool descending) {
  const Tensor x = at_least_1d(in[0]).contiguous();
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), op.name.c_str());
  const long long size = x.size(dim);
  if (k == 0 || x.numel() == 0) return;
  if (size > kSortMax) return run_on_host(op, in, out, a);
  long long inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  int padded = 1;
  while (padded < size) padded *= 2;
  const Contiguous values(out[0]), indices(out[1]);
  kSortLines.launch(x.dtype(), x.device().index, (x.numel() / size) * KernelFamily::kBlock, x.data_ptr(), size, inner, k,
                    padded, static_cast<int>(descending), values.ptr(), indices.ptr());
  values.finish();
  indices.finish();
}

void topk(Span in, Span out, const Attrs& a) {
  static const OpDef& op = find_op("topk");
  sorted_lines(op, in, out, a, a.i("k"), a.b("largest"));
}

void sort(Span in, Span out, const Attrs& a) {
  static const OpDef& op = find_op("sort");
  const long long size = in[0].dim() == 0 ? 1 : in[0].size(wrap_dim(a.i("dim"), in[0].dim(), "sort"));
  sorted_lines(op, in, out, a, size, a.b("descending"));
}

void gather(Span in, Span out, const Attrs& a) {
  constexpr const char* op = "gather";
  const Tensor x = at_least_1d(in[0]);
  const Tensor index = at_least_1d(in[1]).contiguous();
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), op);
  if (out[0].numel() == 0) return;
  KILN_CHECK(x.dim() <= kMaxDims, "{}: on CUDA at most {} dims are supported, got {} and {}", op, kMaxDims,
             x.meta_str(), index.meta_str());
  GatherDims dims{};
  for (int64_t d = 0; d < x.dim(); ++d) {
    dims.size[d] = index.size(d);
    dims.x_stride[d] = x.stride(d);
  }
  const Tensor o = out[0].is_contiguous() ? out[0] : empty(out[0].shape(), {.dtype = out[0].dtype(), .device = out[0].device()});
  const long long total = o.numel(), dim_size = x.size(dim);
  kGather.launch(by_size(x.itemsize()), x.device().index, total, x.data_ptr(), index.data_ptr(), o.data_ptr(), total,
                 static_cast<int>(x.dim()), static_cast<int>(dim), dim_size, dims);
  if (!o.same(out[0])) Tensor(out[0]).copy_(o);
}

// ---- index_select / embedding ----

const KernelFamily kSelectRows("select_rows", R"(
typedef SCALAR T;
extern "C" __global__ void NAME(const T* x, const long long* index, T* out, long long total, long long n,
                                long long size, long long inner) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long w = j / inner, i = j % inner;
  const long long k = index[w % n];
  out[j] = k < 0 || k >= size ? T{} : x[((w / n) * size + k) * inner + i];
}
)",
                               kBySize);

Tensor contiguous_i64(const Tensor& index) { return index.to(DType::i64).contiguous(); }


void select_rows(const Tensor& x, const Tensor& index, const Tensor& out, long long outer, long long size,
                 long long inner) {
  const Contiguous o(out);
  const long long n = index.numel(), total = outer * n * inner;
  kSelectRows.launch(by_size(x.itemsize()), x.device().index, total, x.data_ptr(), index.data_ptr(), o.ptr(),
                     total, n, size, inner);
  o.finish();
}

void index_select(Span in, Span out, const Attrs& a) {
  const Tensor x = at_least_1d(in[0]).contiguous();
  const Tensor index = contiguous_i64(in[1]);
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), "index_select");
  long long outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  if (out[0].numel() == 0) return;
  select_rows(x, index, out[0], outer, x.size(dim), inner);
}

void embedding(Span in, Span out, const Attrs&) {
  const Tensor weight = in[0].contiguous();
  const Tensor index = contiguous_i64(in[1]);
  if (out[0].numel() == 0) return;
  select_rows(weight, index, out[0], 1, weight.size(0), weight.size(1));
}

const KernelFamily kEmbeddingBackward("embedding_backward", R"(
typedef SCALAR T;
extern "C" __global__ void NAME(const T* grad, const long long* index, T* acc, long long n, long long num_weights,
                                long long width, long long groups, long long padding) {
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= width * groups) return;
  const long long col = t % width, group = t / width;
  for (long long r = 0; r < n; ++r) {
    const long long q = index[r];
    if (q == padding || q < 0 || q >= num_weights || q % groups != group) continue;
    T* d = acc + q * width + col;
    *d = *d + grad[r * width + col];
  }
}
)",
                                      {DType::f32, DType::f64});

// About this many threads, when the weight has that many rows to spread them over.
constexpr long long kEmbeddingThreads = 1 << 16;

void embedding_backward(Span in, Span out, const Attrs& a) {
  const Tensor index = contiguous_i64(in[1]);
  const long long num_weights = out[0].size(0), width = out[0].size(1), n = index.numel();
  const long long padding = a.has("padding_idx") ? a.i("padding_idx") : -1;
  const DType c = is_reduced_float(out[0].dtype()) ? DType::f32 : out[0].dtype();
  const Tensor grad = in[0].to(c).contiguous();
  Tensor acc = c == out[0].dtype() && out[0].is_contiguous()
                         ? out[0]
                         : empty(out[0].shape(), {.dtype = c, .device = out[0].device()});
  acc.fill_(0.0);
  if (width > 0 && num_weights > 0) {
    const long long groups = std::clamp(kEmbeddingThreads / width, 1LL, num_weights);
    kEmbeddingBackward.launch(c, acc.device().index, width * groups, grad.data_ptr(), index.data_ptr(), acc.data_ptr(),
                              n, num_weights, width, groups, padding);
  }
  if (!acc.same(out[0])) Tensor(out[0]).copy_(acc);
}

// ---- one_hot ----

const KernelFamily kOneHot("one_hot", R"(
extern "C" __global__ void NAME(const long long* index, long long* out, long long total, long long classes) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  out[j] = index[j / classes] == j % classes ? 1 : 0;
}
)",
                           {DType::i64});

void one_hot(Span in, Span out, const Attrs&) {
  const Tensor index = contiguous_i64(in[0]);
  const long long classes = out[0].shape().back(), total = out[0].numel();
  const Contiguous o(out[0]);
  kOneHot.launch(DType::i64, index.device().index, total, index.data_ptr(), o.ptr(), total, classes);
  o.finish();
}

// ---- flip ----

struct FlipDims {
  long long size[kMaxDims];
  long long stride[kMaxDims];
};

const KernelFamily kFlip("flip", R"(
typedef SCALAR T;
struct FlipDims {
  long long size[8];
  long long stride[8];
};
extern "C" __global__ void NAME(const T* x, T* out, long long total, int ndim, unsigned int flipped, FlipDims dims) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  long long rest = j, offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    long long c = rest % dims.size[d];
    rest /= dims.size[d];
    if ((flipped >> d) & 1u) c = dims.size[d] - 1 - c;
    offset += c * dims.stride[d];
  }
  out[j] = x[offset];
}
)",
                         kBySize);

void flip(Span in, Span out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  KILN_CHECK(x.dim() <= kMaxDims, "flip: on CUDA at most {} dims are supported, got {}", kMaxDims, x.meta_str());
  unsigned flipped = 0;
  // The op rejects a dim listed twice, so each listed dim is reversed once.
  if (x.dim() > 0)
    for (int64_t d : a.ints("dims")) flipped |= 1u << wrap_dim(d, x.dim(), "flip");
  FlipDims dims{};
  for (int64_t d = 0; d < x.dim(); ++d) {
    dims.size[d] = x.size(d);
    dims.stride[d] = x.stride(d);
  }
  const Contiguous o(out[0]);
  const long long total = x.numel();
  kFlip.launch(by_size(x.itemsize()), x.device().index, total, x.data_ptr(), o.ptr(), total,
               static_cast<int>(x.dim()), flipped, dims);
  o.finish();
}

// ---- tril / triu ----

// tril keeps the columns [0, row + diagonal], triu the columns [row + diagonal, cols).
const KernelFamily kTriangle("triangle", R"(
typedef SCALAR T;
extern "C" __global__ void NAME(const T* x, T* out, long long total, long long rows, long long cols,
                                long long diagonal, int lower) {
  const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (j >= total) return;
  const long long col = j % cols, row = (j / cols) % rows;
  const long long split = min(max(row + diagonal + (lower ? 1 : 0), 0LL), cols);
  const bool keep = lower ? col < split : col >= split;
  out[j] = keep ? x[j] : T{};
}
)",
                             kBySize);

template <bool lower>
void triangle(Span in, Span out, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  const long long rows = x.size(-2), cols = x.size(-1), total = x.numel();
  if (total == 0) return;
  const Contiguous o(out[0]);
  kTriangle.launch(by_size(x.itemsize()), x.device().index, total, x.data_ptr(), o.ptr(), total, rows, cols,
                   static_cast<long long>(a.i("diagonal")), lower ? 1 : 0);
  o.finish();
}

struct Registrar {
  Registrar() {
    constexpr auto cuda = DeviceType::cuda;
    register_kernel("gather", cuda, gather);
    register_kernel("scatter_add", cuda, scatter_add);
    register_kernel("topk", cuda, topk);
    register_kernel("sort", cuda, sort);
    register_kernel("index_select", cuda, index_select);
    register_kernel("embedding", cuda, embedding);
    register_kernel("embedding_backward", cuda, embedding_backward);
    register_kernel("one_hot", cuda, one_hot);
    register_kernel("flip", cuda, flip);
    register_kernel("tril", cuda, triangle<true>);
    register_kernel("triu", cuda, triangle<false>);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
