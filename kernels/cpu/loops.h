#pragma once
// Elementwise loops over tensors of any strides: the output and N inputs are broadcast to
// one iteration space, dims are reordered so the output's innermost dim is innermost,
// adjacent dims that stay contiguous in every operand are merged, and the range is split
// among threads. The inner loop has a contiguous fast path the compiler vectorizes.
#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/tensor.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/wide.h"

namespace kiln::cpu {

inline constexpr int kMaxDims = 25;

template <int N>  // operands: [0] is the output, [1..N) the inputs
struct StridedIter {
  int ndim = 0;                                 // dims, innermost first
  int64_t size[kMaxDims];
  int64_t stride[N][kMaxDims];                  // bytes
  char* base[N];
  int64_t numel = 1;

  StridedIter(const Tensor& out, std::array<const Tensor*, N - 1> ins) {
    const int nd = static_cast<int>(out.dim());
    KILN_CHECK(nd <= kMaxDims, "elementwise: {} dims exceed the limit of {}", nd, kMaxDims);
    int64_t sz[kMaxDims], st[N][kMaxDims];
    for (int d = 0; d < nd; ++d) sz[d] = out.shape()[d];
    auto fill = [&](int k, const Tensor& t) {
      const int lead = nd - static_cast<int>(t.dim());
      for (int d = 0; d < nd; ++d) {
        const int td = d - lead;
        const bool bcast = td < 0 || t.shape()[td] == 1;
        st[k][d] = bcast ? 0 : t.strides()[td] * static_cast<int64_t>(t.itemsize());
      }
      base[k] = static_cast<char*>(t.data_ptr());
    };
    fill(0, out);
    for (int k = 1; k < N; ++k) fill(k, *ins[k - 1]);
    // Order dims innermost-first by the output's stride (then the first input's), so a
    // permuted output is walked in memory order.
    int order[kMaxDims];
    for (int d = 0; d < nd; ++d) order[d] = nd - 1 - d;
    for (int i = 1; i < nd; ++i) {
      for (int j = i; j > 0; --j) {
        const int a = order[j - 1], b = order[j];
        auto key = [&](int d, int k) { return st[k][d] < 0 ? -st[k][d] : st[k][d]; };
        bool swap = false;
        for (int k = 0; k < N; ++k) {
          if (key(a, k) == 0 || key(b, k) == 0) continue;
          if (key(a, k) != key(b, k)) {
            swap = key(a, k) > key(b, k);
            break;
          }
        }
        if (!swap) break;
        std::swap(order[j - 1], order[j]);
      }
    }
    for (int i = 0; i < nd; ++i) {
      const int d = order[i];
      if (sz[d] == 1) continue;  // size-1 dims add nothing
      // Merge into the previous (inner) dim when every operand stays contiguous across.
      bool merge = ndim > 0;
      for (int k = 0; k < N && merge; ++k)
        merge = st[k][d] == stride[k][ndim - 1] * size[ndim - 1];
      if (merge) {
        size[ndim - 1] *= sz[d];
        continue;
      }
      size[ndim] = sz[d];
      for (int k = 0; k < N; ++k) stride[k][ndim] = st[k][d];
      ++ndim;
    }
    if (ndim == 0) {  // a single element
      size[0] = 1;
      for (int k = 0; k < N; ++k) stride[k][0] = 0;
      ndim = 1;
    }
    for (int d = 0; d < ndim; ++d) numel *= size[d];
    if (out.numel() == 0) numel = 0;
  }

  // Calls inner(ptrs, inner_strides, count) over the linear range [begin, end).
  template <class Inner>
  void run_range(int64_t begin, int64_t end, Inner& inner) const {
    int64_t idx[kMaxDims];
    int64_t rem = begin;
    char* ptr[N];
    for (int k = 0; k < N; ++k) ptr[k] = base[k];
    for (int d = 0; d < ndim; ++d) {
      idx[d] = rem % size[d];
      rem /= size[d];
      for (int k = 0; k < N; ++k) ptr[k] += idx[d] * stride[k][d];
    }
    int64_t inner_strides[N];
    for (int k = 0; k < N; ++k) inner_strides[k] = stride[k][0];
    int64_t pos = begin;
    while (pos < end) {
      const int64_t count = std::min(size[0] - idx[0], end - pos);
      inner(ptr, inner_strides, count);
      pos += count;
      for (int k = 0; k < N; ++k) ptr[k] += count * stride[k][0];
      idx[0] += count;
      for (int d = 0; d < ndim - 1 && idx[d] == size[d]; ++d) {  // carry
        for (int k = 0; k < N; ++k) ptr[k] -= size[d] * stride[k][d] - stride[k][d + 1];
        idx[d] = 0;
        ++idx[d + 1];
      }
    }
  }

  template <class Inner>
  void run(Inner inner, int64_t grain = kGrain) const {
    parallel_for(numel, grain, [&](int64_t b, int64_t e) { run_range(b, e, inner); });
  }
};

template <class T> inline T load_as(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

namespace detail {

// The loops of map over a contiguous range: every operand dense (scalar_input < 0), or
// input scalar_input a broadcast scalar whose value is hoisted so the loop still vectorizes.
template <class Out, class... In, class F>
[[gnu::always_inline]] inline void map_dense_body(char* const* p, int64_t n, int scalar_input, F& f) {
  Out* o = reinterpret_cast<Out*>(p[0]);
  // always_inline on the lambda too: left out of line, it stays in the plain build.
  [&]<size_t... I>(std::index_sequence<I...>) __attribute__((always_inline)) {
    std::tuple<const In*...> ptrs{reinterpret_cast<const In*>(p[I + 1])...};
    if constexpr (sizeof...(In) == 2) {
      using A = std::tuple_element_t<0, std::tuple<In...>>;
      using B = std::tuple_element_t<1, std::tuple<In...>>;
      if (scalar_input == 1) {
        const auto b = static_cast<compute_t<B>>(*std::get<1>(ptrs));
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<compute_t<A>>(std::get<0>(ptrs)[i]), b));
        return;
      }
      if (scalar_input == 0) {
        const auto a = static_cast<compute_t<A>>(*std::get<0>(ptrs));
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(a, static_cast<compute_t<B>>(std::get<1>(ptrs)[i])));
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i)
      o[i] = static_cast<Out>(f(static_cast<compute_t<In>>(std::get<I>(ptrs)[i])...));
  }(std::index_sequence_for<In...>{});
}

template <class Out, class... In, class F>
void map_dense(char* const* p, int64_t n, int scalar_input, F& f) {
  map_dense_body<Out, In...>(p, n, scalar_input, f);
}

template <class Out, class... In, class F>
KILN_WIDE_LOOP void map_dense_wide(char* const* p, int64_t n, int scalar_input, F& f) {
  map_dense_body<Out, In...>(p, n, scalar_input, f);
}

}  // namespace detail

// Elements of the blocks that stand in for broadcast scalar inputs in map's dense loops.
inline constexpr int64_t kScalarBlock = 256;

// out[i] = f(in0[i], in1[i], ...) in compute types; Out and In... are storage types. The
// operands must already have those dtypes; shapes broadcast to out's.
template <class Out, class... In, class F>
void map(const Tensor& out, F f, const std::same_as<Tensor> auto&... ins) {
  constexpr int N = 1 + sizeof...(In);
  static_assert(sizeof...(In) == sizeof...(ins));
  constexpr bool reduced = (is_16bit_float<Out> || ... || is_16bit_float<In>);
  const bool wide = reduced && wide_loops();
  auto dense_loop = [&](char* const* p, int64_t n, int scalar_input) {
    if constexpr (reduced) {
      if (wide) return detail::map_dense_wide<Out, In...>(p, n, scalar_input, f);
    }
    detail::map_dense<Out, In...>(p, n, scalar_input, f);
  };
  StridedIter<N> it(out, {&ins...});
  it.run([&](char** p, const int64_t* s, int64_t n) {
    // Dense operands, or some inputs broadcast scalars (stride 0).
    constexpr std::array<int64_t, sizeof...(In)> item{static_cast<int64_t>(sizeof(In))...};
    int scalars = 0, scalar_input = -1;
    bool dense = s[0] == sizeof(Out);
    for (size_t k = 0; k < item.size() && dense; ++k) {
      if (s[k + 1] == 0) ++scalars, scalar_input = static_cast<int>(k);
      else dense = s[k + 1] == item[k];
    }
    if (dense && scalars == 0) return dense_loop(p, n, -1);
    // Two inputs, one a scalar: its value is hoisted out of the loop.
    if (dense && item.size() == 2 && scalars == 1) return dense_loop(p, n, scalar_input);
    if (dense && scalars < static_cast<int>(item.size())) {
      // Scalar inputs read from a block of copies, so the dense loop runs over blocks.
      std::tuple<std::array<In, kScalarBlock>...> copies;
      char* q[N];
      auto point = [&](auto& copy, int k) {
        using T = typename std::decay_t<decltype(copy)>::value_type;
        if (s[k] == 0) {
          copy.fill(load_as<T>(p[k]));
          q[k] = reinterpret_cast<char*>(copy.data());
        } else {
          q[k] = p[k];
        }
      };
      [&]<size_t... I>(std::index_sequence<I...>) {
        (point(std::get<I>(copies), static_cast<int>(I) + 1), ...);
      }(std::index_sequence_for<In...>{});
      for (int64_t b = 0; b < n; b += kScalarBlock) {
        q[0] = p[0] + b * static_cast<int64_t>(sizeof(Out));
        const int64_t m = std::min(kScalarBlock, n - b);
        dense_loop(q, m, -1);
        for (int k = 1; k < N; ++k)
          if (s[k] != 0) q[k] += m * s[k];
      }
      return;
    }
    [&]<size_t... I>(std::index_sequence<I...>) {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = static_cast<Out>(
            f(static_cast<compute_t<In>>(*reinterpret_cast<const In*>(p[I + 1] + i * s[I + 1]))...));
      }
    }(std::index_sequence_for<In...>{});
  });
}

}  // namespace kiln::cpu
