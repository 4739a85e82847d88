#pragma once
// The loops of the CPU reductions. An input is read as a contiguous tensor whose dims are in
// memory order, in which adjacent reduced or kept dims merge into groups. When the
// innermost group is reduced, each output folds contiguous rows (a lane-split loop the
// compiler vectorizes); when it is kept, a row of outputs accumulates whole input rows, so
// the dim 0 of [N, C] and batch norm's dims {0,2,3} of NCHW never stride per element. Work
// is split among threads over outputs, or over the reduced range when outputs are few.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "core/ops/reduce.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu::reduction {

struct Group {
  int64_t size;
  int64_t stride;  // in elements
};

// A contiguous input's dims, merged into groups of adjacent reduced or kept dims (size-1
// dims dropped). Outputs are numbered row-major over the kept groups, which is the
// contiguous output's order; a reduced position `r` is row-major over the reduced groups.
struct Layout {
  std::vector<Group> kept, reduced;  // outer to inner
  bool inner_reduced = false;        // the innermost group is reduced
  int64_t n_out = 1, n_red = 1;
};

inline Layout make_layout(const Shape& shape, const std::vector<bool>& reduced) {
  Layout l;
  struct Tagged {
    Group g;
    bool reduced;
  };
  std::vector<Tagged> inner_first;
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t s = shape[i];
    (reduced[i] ? l.n_red : l.n_out) *= s;
    if (s != 1) {
      if (!inner_first.empty() && inner_first.back().reduced == reduced[i])
        inner_first.back().g.size *= s;
      else
        inner_first.push_back({{s, stride}, reduced[i]});
    }
    stride *= s;
  }
  KILN_CHECK(inner_first.size() <= kMaxDims, "reduce: {} dim groups exceed the limit of {}",
             inner_first.size(), kMaxDims);
  l.inner_reduced = !inner_first.empty() && inner_first.front().reduced;
  for (size_t i = inner_first.size(); i-- > 0;)
    (inner_first[i].reduced ? l.reduced : l.kept).push_back(inner_first[i].g);
  return l;
}

// Offset of position `index` (row-major) over groups.
inline int64_t offset_of(std::span<const Group> groups, int64_t index) {
  int64_t offset = 0;
  for (size_t i = groups.size(); i-- > 0;) {
    offset += (index % groups[i].size) * groups[i].stride;
    index /= groups[i].size;
  }
  return offset;
}

// Walks positions row-major over groups, keeping the element offset.
class Odometer {
 public:
  Odometer(std::span<const Group> groups, int64_t start) : n_(static_cast<int>(groups.size())) {
    for (int i = n_; i-- > 0;) {
      size_[i] = groups[i].size;
      stride_[i] = groups[i].stride;
      index_[i] = start % size_[i];
      start /= size_[i];
      offset_ += index_[i] * stride_[i];
    }
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (int i = n_; i-- > 0;) {
      offset_ += stride_[i];
      if (++index_[i] < size_[i]) return;
      offset_ -= size_[i] * stride_[i];
      index_[i] = 0;
    }
  }

 private:
  int n_;
  int64_t offset_ = 0;
  int64_t size_[kMaxDims], stride_[kMaxDims], index_[kMaxDims];
};

// ---- the loops ----
//
// An op (kernels/cpu/reduce.cpp has them) says how to reduce:
//   using In = storage type; using Acc = accumulator; static constexpr bool kIndexed
//   Acc init(o)                       the identity, for output o
//   void step(Acc&, x, r, o)          folds in x (in compute type) at reduced position r
//   void combine(Acc& a, const Acc& b) folds in b, which covers positions after a's
//   void store(o, const Acc&)         writes output o
// kIndexed ops see positions in order; others may be folded in any order (lane-split).

inline constexpr int kLanes = 8;
inline constexpr int64_t kColumns = 1024;    // outputs accumulated together (kept inner dim)
inline constexpr int64_t kMinSplit = 16384;  // fewest reduced elements worth a thread

template <class T>
compute_t<T> load(const T& v) {
  return static_cast<compute_t<T>>(v);
}

template <class Op>
class Reduction {
 public:
  using In = typename Op::In;
  using Acc = typename Op::Acc;

  Reduction(const Layout& l, const In* x, const Op& op) : l_(l), x_(x), op_(op) {
    if (!l.inner_reduced) {
      k_ = l.kept.empty() ? 1 : l.kept.back().size;
      outer_kept_ = std::span<const Group>(l.kept).first(l.kept.empty() ? 0 : l.kept.size() - 1);
    }
  }

  void run() const {
    if (l_.n_out == 0) return;
    if (l_.n_red == 0) {
      for (int64_t o = 0; o < l_.n_out; ++o) op_.store(o, op_.init(o));
      return;
    }
    const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const int64_t chunks_per_row = (k_ + kColumns - 1) / kColumns;
    const int64_t units = l_.inner_reduced ? l_.n_out : (l_.n_out / k_) * chunks_per_row;
    const int64_t per_unit = l_.n_red * (l_.inner_reduced ? 1 : std::min(k_, kColumns));
    const int64_t splits = std::min(threads, l_.n_red / kMinSplit);
    if (units >= threads || splits < 2) {
      parallel_for(units, std::max<int64_t>(1, kGrain / per_unit), [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) unit(u, chunks_per_row);
      });
      return;
    }
    for (int64_t u = 0; u < units; ++u) split_unit(u, chunks_per_row, splits);
  }

 private:
  // Reduced range [rb, re) of chunk `c` of `splits`.
  int64_t split_point(int64_t c, int64_t splits) const { return l_.n_red * c / splits; }

  void unit(int64_t u, int64_t chunks_per_row) const {
    if (l_.inner_reduced) {
      Acc acc = op_.init(u);
      rows(u, 0, l_.n_red, acc);
      op_.store(u, acc);
      return;
    }
    const int64_t p = u / chunks_per_row, c0 = (u % chunks_per_row) * kColumns;
    const int64_t width = std::min(kColumns, k_ - c0), o0 = p * k_ + c0;
    Acc acc[kColumns];
    for (int64_t j = 0; j < width; ++j) acc[j] = op_.init(o0 + j);
    columns(p, c0, width, 0, l_.n_red, acc);
    for (int64_t j = 0; j < width; ++j) op_.store(o0 + j, acc[j]);
  }

  // One unit's reduced range split among threads, the partial results combined in order.
  void split_unit(int64_t u, int64_t chunks_per_row, int64_t splits) const {
    if (l_.inner_reduced) {
      // Not std::vector: Acc may be bool.
      const auto partial = std::make_unique<Acc[]>(static_cast<size_t>(splits));
      for (int64_t c = 0; c < splits; ++c) partial[c] = op_.init(u);
      parallel_for(splits, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c)
          rows(u, split_point(c, splits), split_point(c + 1, splits), partial[c]);
      });
      for (int64_t c = 1; c < splits; ++c) op_.combine(partial[0], partial[c]);
      op_.store(u, partial[0]);
      return;
    }
    const int64_t p = u / chunks_per_row, c0 = (u % chunks_per_row) * kColumns;
    const int64_t width = std::min(kColumns, k_ - c0), o0 = p * k_ + c0;
    const auto partial = std::make_unique<Acc[]>(static_cast<size_t>(splits * width));
    for (int64_t c = 0; c < splits; ++c)
      for (int64_t j = 0; j < width; ++j) partial[c * width + j] = op_.init(o0 + j);
    parallel_for(splits, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        columns(p, c0, width, split_point(c, splits), split_point(c + 1, splits),
                &partial[c * width]);
    });
    for (int64_t j = 0; j < width; ++j) {
      for (int64_t c = 1; c < splits; ++c) op_.combine(partial[j], partial[c * width + j]);
      op_.store(o0 + j, partial[j]);
    }
  }

  // Inner dim reduced: folds reduced positions [rb, re) of output o, row by row.
  void rows(int64_t o, int64_t rb, int64_t re, Acc& acc) const {
    const std::span<const Group> outer =
        std::span<const Group>(l_.reduced).first(l_.reduced.size() - 1);
    const int64_t row = l_.reduced.back().size;
    const In* base = x_ + offset_of(l_.kept, o);
    int64_t i = rb % row;
    Odometer od(outer, rb / row);
    for (int64_t r = rb; r < re; od.next()) {
      const int64_t n = std::min(row - i, re - r);
      fold_row(base + od.offset() + i, n, r, o, acc);
      r += n;
      i = 0;
    }
  }

  void fold_row(const In* p, int64_t n, int64_t r0, int64_t o, Acc& acc) const {
    int64_t i = 0;
    if constexpr (!Op::kIndexed) {
      if (n >= 2 * kLanes) {
        // Independent lanes break the dependency chain so the loop vectorizes.
        Acc lanes[kLanes];
        for (int j = 0; j < kLanes; ++j) lanes[j] = op_.init(o);
        for (; i + kLanes <= n; i += kLanes)
          for (int j = 0; j < kLanes; ++j) op_.step(lanes[j], load(p[i + j]), 0, o);
        for (int j = 0; j < kLanes; ++j) op_.combine(acc, lanes[j]);
      }
    }
    for (; i < n; ++i) op_.step(acc, load(p[i]), r0 + i, o);
  }

  // Inner dim kept: folds reduced positions [rb, re) into outputs o0 .. o0 + width of
  // outer row p, one contiguous input row at a time.
  void columns(int64_t p, int64_t c0, int64_t width, int64_t rb, int64_t re, Acc* acc) const {
    const In* base = x_ + offset_of(outer_kept_, p) + c0;
    const int64_t o0 = p * k_ + c0;
    Odometer od(l_.reduced, rb);
    for (int64_t r = rb; r < re; ++r, od.next()) {
      const In* row = base + od.offset();
      for (int64_t j = 0; j < width; ++j) op_.step(acc[j], load(row[j]), r, o0 + j);
    }
  }

  const Layout& l_;
  const In* x_;
  const Op& op_;
  int64_t k_ = 1;  // size of the kept inner group
  std::span<const Group> outer_kept_;
};

// The input converted to `dtype` and made contiguous with its dims in memory order, so that
// a transposed or permuted input is read in place rather than gathered, and the layout of
// reducing `dims` of it. Outputs come in the order their dims have there; when that is not
// their logical order, the kernel writes a temporary that `finish` copies into the output.
class Plan {
 public:
  // `keep_reduced_order`: positions of several reduced dims must stay row-major in the
  // logical order (argmax over a flattened tensor).
  Plan(const Tensor& in, DType dtype, const DimList& dims, const char* op,
       bool keep_reduced_order = false) {
    const Shape& shape = in.shape();
    const std::vector<bool> reduced = reduced_dims(shape, dims, op);
    const size_t nd = shape.size();
    std::vector<int64_t> perm;  // dims of size > 1, outermost in memory first; then the rest
    int reduced_count = 0;
    for (size_t d = 0; d < nd; ++d) {
      if (shape[d] == 1) continue;
      perm.push_back(static_cast<int64_t>(d));
      reduced_count += reduced[d];
    }
    if (!keep_reduced_order || reduced_count < 2) {
      std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
        return std::abs(in.strides()[a]) > std::abs(in.strides()[b]);
      });
    }
    for (size_t d = 0; d < nd; ++d)
      if (shape[d] == 1) perm.push_back(static_cast<int64_t>(d));

    bool identity = true;
    for (size_t i = 0; i < nd; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    x_ = as_dtype(identity ? in : in.permute(perm), dtype).contiguous();
    std::vector<bool> permuted_reduced(nd);
    for (size_t i = 0; i < nd; ++i) permuted_reduced[i] = reduced[perm[i]];
    layout_ = make_layout(x_.shape(), permuted_reduced);

    // Output order: each kept dim's logical rank, in the order the kernel produces them.
    std::vector<int64_t> rank(nd, -1);
    for (size_t d = 0; d < nd; ++d) {
      if (reduced[d]) continue;
      rank[d] = static_cast<int64_t>(kept_sizes_.size());
      kept_sizes_.push_back(shape[d]);
    }
    bool in_order = true;
    int64_t last = -1;
    for (int64_t d : perm) {
      if (reduced[d]) continue;
      out_perm_.push_back(rank[d]);
      target_shape_.push_back(shape[d]);
      if (shape[d] == 1) continue;
      in_order = in_order && rank[d] > last;
      last = rank[d];
    }
    if (in_order) out_perm_.clear();
  }

  const Layout& layout() const { return layout_; }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(x_.data_ptr());
  }

  // The tensor the kernel writes for output `out`.
  Tensor target(const Tensor& out) const {
    if (!out_perm_.empty()) return make_tensor(target_shape_, out.dtype(), out.device());
    KILN_CHECK(out.is_contiguous(), "reduce: expects a contiguous output, got {}", out.meta_str());
    return out;
  }
  void finish(const Tensor& out, const Tensor& target) const {
    if (!out_perm_.empty()) out.reshape(kept_sizes_).permute(out_perm_).copy_(target);
  }

 private:
  Tensor x_;
  Layout layout_;
  Shape kept_sizes_;               // in logical order
  Shape target_shape_;             // in the kernel's order
  std::vector<int64_t> out_perm_;  // empty when the orders agree
};

// Reduces the planned input with `op`, which stores each output.
template <class Op>
void run(const Plan& plan, const Op& op) {
  Reduction<Op>(plan.layout(), plan.data<typename Op::In>(), op).run();
}

}  // namespace kiln::cpu::reduction
