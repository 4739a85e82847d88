// CPU kernels of the indexing ops. Index values are checked in a serial pass before the
// parallel work starts, so that no error is thrown from inside an OpenMP region.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/loops.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// The index as contiguous i64 (a copy only when it is i32 or strided).
Tensor contiguous_i64(const Tensor& index) {
  return (index.dtype() == DType::i64 ? index : index.to(DType::i64)).contiguous();
}

void check_range(const Tensor& index, int64_t size, const char* op, int64_t dim) {
  const int64_t* p = index.data_ptr<int64_t>();
  const int64_t n = index.numel();
  for (int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= size)
      fail("{}: index {} is out of range for dim {} with size {}", op, p[i], dim, size);
}

// A 0-d tensor as a 1-d tensor of one element, so that every kernel has a dim to work on.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// x viewed with shape `shape` and its own strides; `shape` must fit inside x.
Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  return make_view(x, shape, x.strides(), x.offset());
}

// Calls line(ptrs, j_strides, len) for every line along `dim` of `shape`: each operand's
// view over shape with dim shrunk to 1 gives where its line starts. Lines are disjoint in
// every dim but `dim`, so threads may split them freely.
template <int N, class Line>
void for_each_line(const Shape& shape, int64_t dim, std::array<const Tensor*, N> operands,
                   Line line) {
  Shape starts = shape;
  const int64_t len = starts[dim];
  starts[dim] = 1;
  std::array<Tensor, N> views;
  for (int k = 0; k < N; ++k) views[k] = view_as_shape(*operands[k], starts);
  std::array<const Tensor*, N - 1> rest;
  for (int k = 1; k < N; ++k) rest[k - 1] = &views[k];
  StridedIter<N> it(views[0], rest);
  int64_t along[N];
  for (int k = 0; k < N; ++k)
    along[k] = operands[k]->strides()[dim] * static_cast<int64_t>(operands[k]->itemsize());
  it.run(
      [&](char** p, const int64_t* s, int64_t n) {
        char* ptr[N];
        for (int64_t i = 0; i < n; ++i) {
          for (int k = 0; k < N; ++k) ptr[k] = p[k] + i * s[k];
          line(ptr, along, len);
        }
      },
      std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)));
}

template <class T>
T load(const char* p) {
  return *reinterpret_cast<const T*>(p);
}
template <class T>
T& ref(char* p) {
  return *reinterpret_cast<T*>(p);
}

// ---- gather / scatter_add ----
void gather(Span in, Span out, const Attrs& a) {
  const Tensor x = at_least_1d(in[0]);
  const Tensor index = contiguous_i64(at_least_1d(in[1]));
  const Tensor o = at_least_1d(out[0]);
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), "gather");
  check_range(index, x.size(dim), "gather", dim);
  if (o.numel() == 0) return;
  // The input's line starts at the index's coordinates with dim 0; the index picks along dim.
  const int64_t x_along = x.strides()[dim] * static_cast<int64_t>(x.itemsize());
  visit_dtype(x.dtype(), [&]<class T>() {
    for_each_line<3>(index.shape(), dim, {&o, &x, &index},
                     [&](char** p, const int64_t* along, int64_t len) {
                       for (int64_t j = 0; j < len; ++j) {
                         const int64_t k = load<int64_t>(p[2] + j * along[2]);
                         ref<T>(p[0] + j * along[0]) = load<T>(p[1] + k * x_along);
                       }
                     });
  });
}

void scatter_add(Span in, Span out, const Attrs& a) {
  const Tensor o = at_least_1d(out[0]);
  Tensor(o).copy_(at_least_1d(in[0]));
  const Tensor index = contiguous_i64(at_least_1d(in[1]));
  const Tensor src = at_least_1d(in[2]);
  const int64_t dim = wrap_dim(a.i("dim"), o.dim(), "scatter_add");
  check_range(index, o.size(dim), "scatter_add", dim);
  if (index.numel() == 0) return;
  const int64_t o_along = o.strides()[dim] * static_cast<int64_t>(o.itemsize());
  visit_dtype(o.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    // Each line of the index writes only to the output line with its own coordinates
    // outside dim, so lines run in parallel without conflicts.
    for_each_line<3>(
        index.shape(), dim, {&o, &src, &index}, [&](char** p, const int64_t* along, int64_t len) {
          for (int64_t j = 0; j < len; ++j) {
            const int64_t k = load<int64_t>(p[2] + j * along[2]);
            T& dst = ref<T>(p[0] + k * o_along);
            dst = static_cast<T>(
                scalar::add(static_cast<C>(dst), static_cast<C>(load<T>(p[1] + j * along[1]))));
          }
        });
  });
}

// ---- index_select / embedding ----

// out[o][j][:] = x[o][index[j]][:] for x viewed as [outer, size, inner], both contiguous.
void select_rows(const Tensor& x, const Tensor& index, const Tensor& out, int64_t outer,
                 int64_t size, int64_t inner) {
  const int64_t n = index.numel();
  const int64_t* idx = index.data_ptr<int64_t>();
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    parallel_for(outer * n, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t w = b; w < e; ++w) {
                     const T* s = src + ((w / n) * size + idx[w % n]) * inner;
                     T* d = dst + w * inner;
                     for (int64_t i = 0; i < inner; ++i) d[i] = s[i];
                   }
                 });
  });
}

void index_select(Span in, Span out, const Attrs& a) {
  const Tensor x = at_least_1d(in[0]).contiguous();
  const Tensor index = contiguous_i64(in[1]);
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), "index_select");
  check_range(index, x.size(dim), "index_select", dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  select_rows(x, index, out[0], outer, x.size(dim), inner);
}

void embedding(Span in, Span out, const Attrs&) {
  const Tensor weight = in[0].contiguous();
  const Tensor index = contiguous_i64(in[1]);
  check_range(index, weight.size(0), "embedding", 0);
  select_rows(weight, index, out[0], 1, weight.size(0), weight.size(1));
}

void embedding_backward(Span in, Span out, const Attrs& a) {
  const Tensor index = contiguous_i64(in[1]);
  const int64_t num_weights = out[0].size(0), width = out[0].size(1), n = index.numel();
  check_range(index, num_weights, "embedding_backward", 0);
  const int64_t padding = a.has("padding_idx") ? a.i("padding_idx") : -1;
  const int64_t* idx = index.data_ptr<int64_t>();
  // 16-bit floats accumulate in f32 and round once at the end.
  const DType c = is_reduced_float(out[0].dtype()) ? DType::f32 : out[0].dtype();
  const Tensor grad = as_dtype(in[0], c).contiguous();
  into(out[0], c, [&](const Tensor& o) {
    visit_floating(c, "embedding_backward", [&]<class T>() {
      const T* g = static_cast<const T*>(grad.data_ptr());
      T* acc = static_cast<T*>(o.data_ptr());
      std::fill(acc, acc + num_weights * width, static_cast<T>(0.0f));
      // Threads own column ranges, so rows that share an index never race and every row
      // sums its gradients in index order (deterministic).
      parallel_for(width, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = 0; r < n; ++r) {
                       if (idx[r] == padding) continue;
                       T* d = acc + idx[r] * width;
                       const T* s = g + r * width;
                       for (int64_t col = b; col < e; ++col) d[col] = d[col] + s[col];
                     }
                   });
    });
  });
}

// ---- one_hot ----
void one_hot(Span in, Span out, const Attrs&) {
  const Tensor index = contiguous_i64(in[0]);
  const int64_t classes = out[0].shape().back(), n = index.numel();
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    KILN_CHECK(idx[i] >= 0, "one_hot: class values must be non-negative, got {}", idx[i]);
    KILN_CHECK(idx[i] < classes, "one_hot: class value {} is out of range for num_classes {}",
               idx[i], classes);
  }
  int64_t* dst = out[0].data_ptr<int64_t>();
  parallel_for(n, std::max<int64_t>(1, kGrain / std::max<int64_t>(classes, 1)),
               [&](int64_t b, int64_t e) {
                 std::fill(dst + b * classes, dst + e * classes, int64_t{0});
                 for (int64_t i = b; i < e; ++i) dst[i * classes + idx[i]] = 1;
               });
}

// ---- flip ----
// A view with negated strides along the flipped dims reads x backwards; map copies it.
void flip(Span in, Span out, const Attrs& a) {
  const Tensor& x = in[0];
  Shape strides = x.strides();
  int64_t offset = x.offset();
  if (x.numel() == 0) return;
  for (int64_t d : a.ints("dims")) {
    if (x.dim() == 0) break;
    const int64_t w = wrap_dim(d, x.dim(), "flip");
    offset += (x.shape()[w] - 1) * strides[w];
    strides[w] = -strides[w];
  }
  const Tensor reversed = make_view(x, x.shape(), strides, offset);
  visit_dtype(x.dtype(), [&]<class T>() {
    map<T, T>(
        out[0], [](auto v) { return v; }, reversed);
  });
}

// ---- tril / triu ----
template <bool lower>
void triangle(Span in, Span out, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  const int64_t rows = x.size(-2), cols = x.size(-1), diagonal = a.i("diagonal");
  const int64_t n = rows == 0 || cols == 0 ? 0 : x.numel() / cols;
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out[0].data_ptr());
    const T zero = static_cast<T>(compute_t<T>(0));
    parallel_for(
        n, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
          for (int64_t w = b; w < e; ++w) {
            const int64_t row = w % rows;
            // tril keeps columns [0, row + diagonal], triu keeps [row + diagonal, cols).
            const int64_t split = std::clamp<int64_t>(row + diagonal + (lower ? 1 : 0), 0, cols);
            const T* s = src + w * cols;
            T* d = dst + w * cols;
            for (int64_t c = 0; c < split; ++c) d[c] = lower ? s[c] : zero;
            for (int64_t c = split; c < cols; ++c) d[c] = lower ? zero : s[c];
          }
        });
  });
}

// ---- cumsum ----
void cumsum(Span in, Span out, const Attrs& a) {
  const Tensor& o = out[0];
  const Tensor x = at_least_1d(as_dtype(in[0], o.dtype()).contiguous());
  const int64_t dim = wrap_dim(a.i("dim"), x.dim(), "cumsum");
  int64_t outer = 1, inner = 1;
  const int64_t size = x.size(dim);
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  if (x.numel() == 0) return;
  // Work items are column blocks of one outer slice; each keeps its running sums in a
  // buffer and sweeps along dim, so the inner loop runs over contiguous columns.
  const int64_t block = std::min<int64_t>(inner, 256), blocks = (inner + block - 1) / block;
  visit_dtype(o.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    // Like PyTorch's CPU kernel: floats sum in double, integers in i64.
    using Acc = std::conditional_t<std::is_floating_point_v<C>, double, int64_t>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(o.data_ptr());
    parallel_for(outer * blocks, std::max<int64_t>(1, kGrain / (size * block)),
                 [&](int64_t b, int64_t e) {
                   std::vector<Acc> acc(static_cast<size_t>(block));
                   for (int64_t w = b; w < e; ++w) {
                     const int64_t slice = w / blocks, c0 = (w % blocks) * block;
                     const int64_t width = std::min(block, inner - c0);
                     std::fill(acc.begin(), acc.end(), Acc(0));
                     for (int64_t k = 0; k < size; ++k) {
                       const int64_t base = (slice * size + k) * inner + c0;
                       for (int64_t c = 0; c < width; ++c) {
                         acc[c] += static_cast<Acc>(static_cast<C>(src[base + c]));
                         dst[base + c] = static_cast<T>(static_cast<C>(acc[c]));
                       }
                     }
                   }
                 });
  });
}

// ---- sort / topk ----

// Writes the first k of each line of x along dim, ordered, with their positions. NaN
// orders as the largest value; ties keep the lower position first (a stable order).
void sorted_lines(const Tensor& input, int64_t dim_attr, int64_t k, bool descending,
                  const Tensor& values, const Tensor& indices) {
  const Tensor x = at_least_1d(input).contiguous();
  const int64_t dim = wrap_dim(dim_attr, x.dim(), "sort");
  int64_t outer = 1, inner = 1;
  const int64_t size = x.size(dim);
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  if (k == 0 || x.numel() == 0) return;
  visit_dtype(x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* out_v = static_cast<T*>(values.data_ptr());
    int64_t* out_i = indices.data_ptr<int64_t>();
    parallel_for(outer * inner, std::max<int64_t>(1, kGrain / size), [&](int64_t b, int64_t e) {
      std::vector<C> line(static_cast<size_t>(size));
      std::vector<int64_t> order(static_cast<size_t>(size));
      auto before = [&](int64_t i, int64_t j) {
        const C u = line[i], v = line[j];
        const bool u_nan = scalar::is_nan(u), v_nan = scalar::is_nan(v);
        if (u_nan != v_nan) return descending ? u_nan : v_nan;
        if (!u_nan && u != v) return descending ? u > v : u < v;
        return i < j;
      };
      for (int64_t w = b; w < e; ++w) {
        const int64_t slice = w / inner, col = w % inner;
        const T* s = src + slice * size * inner + col;
        for (int64_t j = 0; j < size; ++j) {
          line[j] = static_cast<C>(s[j * inner]);
          order[j] = j;
        }
        if (k == size)
          std::sort(order.begin(), order.end(), before);
        else
          std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        T* dv = out_v + slice * k * inner + col;
        int64_t* di = out_i + slice * k * inner + col;
        for (int64_t j = 0; j < k; ++j) {
          dv[j * inner] = s[order[j] * inner];
          di[j * inner] = order[j];
        }
      }
    });
  });
}

void topk(Span in, Span out, const Attrs& a) {
  sorted_lines(in[0], a.i("dim"), a.i("k"), a.b("largest"), out[0], out[1]);
}

void sort(Span in, Span out, const Attrs& a) {
  const int64_t size = in[0].dim() == 0 ? 1 : in[0].size(a.i("dim"));
  sorted_lines(in[0], a.i("dim"), size, a.b("descending"), out[0], out[1]);
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("gather", cpu, gather);
    register_kernel("scatter_add", cpu, scatter_add);
    register_kernel("index_select", cpu, index_select);
    register_kernel("embedding", cpu, embedding);
    register_kernel("embedding_backward", cpu, embedding_backward);
    register_kernel("one_hot", cpu, one_hot);
    register_kernel("flip", cpu, flip);
    register_kernel("tril", cpu, triangle<true>);
    register_kernel("triu", cpu, triangle<false>);
    register_kernel("cumsum", cpu, cumsum);
    register_kernel("topk", cpu, topk);
    register_kernel("sort", cpu, sort);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
