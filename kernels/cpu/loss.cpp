// CPU kernels of the loss ops and their backward ops. Losses accumulate in f64, in fixed
// chunks summed in order, so a reduced loss does not depend on the thread count.
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/loops.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

enum class Reduction { none, mean, sum };

Reduction reduction_of(const Attrs& a) {
  const std::string& r = a.str("reduction");
  return r == "none" ? Reduction::none : r == "sum" ? Reduction::sum : Reduction::mean;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The sum of f(i) over [0, n): chunks in parallel, then the chunks' sums in order.
template <class F>
double ordered_sum(int64_t n, int64_t cost_per_item, F f) {
  constexpr int64_t kChunk = 2048;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, std::max<int64_t>(1, kGrain / (kChunk * cost_per_item)),
               [&](int64_t b, int64_t e) {
                 for (int64_t c = b; c < e; ++c) {
                   double s = 0;
                   for (int64_t i = c * kChunk, end = std::min(n, i + kChunk); i < end; ++i)
                     s += f(i);
                   partial[static_cast<size_t>(c)] = s;
                 }
               });
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

// A tensor with a class dim seen as [N, C, S] (S the product of the trailing dims), with
// element strides; a view unless its strides don't allow one.
template <class T>
struct ClassView {
  Tensor keep;  // owns the memory `data` points into
  const T* data;
  int64_t n, classes, spatial;
  int64_t stride_n, stride_c, stride_s;

  explicit ClassView(const Tensor& x) {
    const int64_t c = x.dim() == 1 ? x.size(0) : x.size(1);
    const int64_t batch = x.dim() == 1 ? 1 : x.size(0);
    int64_t s = 1;
    for (int64_t d = 2; d < x.dim(); ++d) s *= x.size(d);
    keep = x.reshape({batch, c, s});
    data = keep.data_ptr<T>();
    n = batch, classes = c, spatial = s;
    stride_n = keep.stride(0), stride_c = keep.stride(1), stride_s = keep.stride(2);
  }
  // The first class of element e = n * S + s.
  const T* at(int64_t e) const {
    return data + (e / spatial) * stride_n + (e % spatial) * stride_s;
  }
};

// The [C] class weights as f64, or empty when there are none.
std::vector<double> class_weights(const Tensor& w) {
  if (!w.defined()) return {};
  const Tensor c = w.to(DType::f64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// The output itself, or a contiguous stand-in (copied back by the caller) when an in-place
// call passed a strided one.
Tensor contiguous_target(const Tensor& out) {
  return out.is_contiguous() ? out : make_tensor(out.shape(), out.dtype(), out.device());
}

// grad_out as f64 values (one for "mean" and "sum", one per element for "none").
std::vector<double> grad_values(const Tensor& g) {
  const Tensor c = g.to(DType::f64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// ---- class-index losses: nll_loss and cross_entropy_loss (with label smoothing) ----

struct ClassIndexProblem {
  const char* op;
  Tensor target;  // contiguous i64
  const int64_t* targets;
  std::vector<double> weight;
  int64_t ignore_index;
  double smoothing;
  Reduction reduction;
  double total_weight = 0;  // of the targets that are not ignored

  ClassIndexProblem(const char* name, Span in, const Attrs& a, int64_t classes)
      : op(name),
        target(in[1].contiguous()),
        targets(target.data_ptr<int64_t>()),
        weight(class_weights(in[2])),
        ignore_index(a.i("ignore_index")),
        smoothing(a.has("label_smoothing") ? a.f("label_smoothing") : 0.0),
        reduction(reduction_of(a)) {
    // Checked before any parallel work: errors must not be thrown from a worker thread.
    const int64_t* t = targets;
    for (int64_t e = 0, n = target.numel(); e < n; ++e) {
      if (t[e] == ignore_index) continue;
      KILN_CHECK(t[e] >= 0 && t[e] < classes,
                 "{}: target {} is out of bounds for {} classes (input {}, target {}, "
                 "ignore_index {})",
                 op, t[e], classes, shape_str(in[0].shape()), target.meta_str(), ignore_index);
      total_weight += w(t[e]);
    }
  }
  double w(int64_t c) const { return weight.empty() ? 1.0 : weight[static_cast<size_t>(c)]; }
  int64_t cost(int64_t classes) const { return smoothing > 0 ? classes : 1; }
};

template <class T>
double class_index_element(const ClassIndexProblem& p, const ClassView<T>& x, int64_t e) {
  const int64_t t = p.targets[e];
  if (t == p.ignore_index) return 0.0;
  const T* row = x.at(e);
  const double nll = -p.w(t) * static_cast<double>(row[t * x.stride_c]);
  if (p.smoothing == 0) return nll;
  double smooth = 0;
  for (int64_t c = 0; c < x.classes; ++c)
    smooth -= p.w(c) * static_cast<double>(row[c * x.stride_c]);
  return (1 - p.smoothing) * nll + p.smoothing / static_cast<double>(x.classes) * smooth;
}

template <const char* op>
void class_index_loss(Span in, Span out, const Attrs& attrs) {
  visit_floating(in[0].dtype(), op, [&]<class T>() {
    const ClassView<T> x(in[0]);
    const ClassIndexProblem p(op, in, attrs, x.classes);
    const int64_t count = x.n * x.spatial;
    auto element = [&](int64_t e) { return class_index_element(p, x, e); };
    if (p.reduction == Reduction::none) {
      const Tensor y = contiguous_target(out[0]);
      T* py = y.data_ptr<T>();
      parallel_for(count, std::max<int64_t>(1, kGrain / p.cost(x.classes)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t i = b; i < e; ++i) py[i] = static_cast<T>(element(i));
                   });
      if (!y.same(out[0])) Tensor(out[0]).copy_(y);
      return;
    }
    const double sum = ordered_sum(count, p.cost(x.classes), element);
    const double loss = p.reduction == Reduction::sum ? sum : sum / p.total_weight;
    Tensor(out[0]).fill_(loss);
  });
}

template <const char* op>
void class_index_backward(Span in, Span out, const Attrs& attrs) {
  const Tensor gx = contiguous_target(out[0]);
  visit_floating(in[1].dtype(), op, [&]<class T>() {
    const ClassView<T> x(in[1]);
    const ClassIndexProblem p(op, in.subspan(1), attrs, x.classes);
    const std::vector<double> g = grad_values(in[0]);
    const int64_t count = x.n * x.spatial, classes = x.classes, spatial = x.spatial;
    const double scale = p.reduction == Reduction::mean ? 1.0 / p.total_weight : 1.0;
    const int64_t* t = p.targets;
    T* pgx = gx.data_ptr<T>();
    // Every element writes its C entries of the gradient (zeros where ignored).
    parallel_for(
        count, std::max<int64_t>(1, kGrain / std::max<int64_t>(classes, 1)),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            T* row = pgx + (i / spatial) * classes * spatial + i % spatial;
            const double gi =
                (p.reduction == Reduction::none ? g[static_cast<size_t>(i)] : g[0]) * scale;
            const bool ignored = t[i] == p.ignore_index;
            const double smooth = ignored ? 0.0 : -p.smoothing / static_cast<double>(classes) * gi;
            for (int64_t c = 0; c < classes; ++c) {
              double v = smooth * p.w(c);
              if (!ignored && c == t[i]) v -= (1 - p.smoothing) * p.w(c) * gi;
              row[c * spatial] = static_cast<T>(v);
            }
          }
        });
  });
  if (!gx.same(out[0])) Tensor(out[0]).copy_(gx);
}

// ---- cross_entropy_prob_loss: class probabilities as the target ----

template <class T>
struct ProbProblem {
  ClassView<T> x, target;
  std::vector<double> weight;
  double smoothing;
  Reduction reduction;

  ProbProblem(Span in, const Attrs& a)
      : x(in[0]),
        target(in[1].dtype() == in[0].dtype() ? in[1] : in[1].to(in[0].dtype())),
        weight(class_weights(in[2])),
        smoothing(a.f("label_smoothing")),
        reduction(reduction_of(a)) {}
  double w(int64_t c) const { return weight.empty() ? 1.0 : weight[static_cast<size_t>(c)]; }
  // The smoothed target probability of class c of element e.
  double p(const T* target_row, int64_t c) const {
    return static_cast<double>(target_row[c * target.stride_c]) * (1 - smoothing) +
           smoothing / static_cast<double>(x.classes);
  }
};

void prob_loss(Span in, Span out, const Attrs& attrs) {
  visit_floating(in[0].dtype(), "cross_entropy_prob_loss", [&]<class T>() {
    const ProbProblem<T> p(in, attrs);
    const int64_t count = p.x.n * p.x.spatial, classes = p.x.classes;
    auto element = [&](int64_t e) {
      const T* xr = p.x.at(e);
      const T* tr = p.target.at(e);
      double s = 0;
      for (int64_t c = 0; c < classes; ++c)
        s -= p.w(c) * p.p(tr, c) * static_cast<double>(xr[c * p.x.stride_c]);
      return s;
    };
    if (p.reduction == Reduction::none) {
      const Tensor y = contiguous_target(out[0]);
      T* py = y.data_ptr<T>();
      parallel_for(count, std::max<int64_t>(1, kGrain / std::max<int64_t>(classes, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t i = b; i < e; ++i) py[i] = static_cast<T>(element(i));
                   });
      if (!y.same(out[0])) Tensor(out[0]).copy_(y);
      return;
    }
    const double sum = ordered_sum(count, std::max<int64_t>(classes, 1), element);
    double loss = sum;
    if (p.reduction == Reduction::mean) loss = in[0].numel() == 0 ? kNaN : sum / count;
    Tensor(out[0]).fill_(loss);
  });
}

void prob_loss_backward(Span in, Span out, const Attrs& attrs) {
  const Tensor gx = contiguous_target(out[0]);
  visit_floating(in[1].dtype(), "cross_entropy_prob_loss_backward", [&]<class T>() {
    const ProbProblem<T> p(in.subspan(1), attrs);
    const std::vector<double> g = grad_values(in[0]);
    const int64_t count = p.x.n * p.x.spatial, classes = p.x.classes, spatial = p.x.spatial;
    const double scale = p.reduction == Reduction::mean ? 1.0 / static_cast<double>(count) : 1.0;
    T* pgx = gx.data_ptr<T>();
    parallel_for(count, std::max<int64_t>(1, kGrain / std::max<int64_t>(classes, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t i = b; i < e; ++i) {
                     T* row = pgx + (i / spatial) * classes * spatial + i % spatial;
                     const T* tr = p.target.at(i);
                     const double gi =
                         (p.reduction == Reduction::none ? g[static_cast<size_t>(i)] : g[0]) *
                         scale;
                     for (int64_t c = 0; c < classes; ++c)
                       row[c * spatial] = static_cast<T>(-p.w(c) * p.p(tr, c) * gi);
                   }
                 });
  });
  if (!gx.same(out[0])) Tensor(out[0]).copy_(gx);
}

// ---- mse_loss ----

void mse(Span in, Span out, const Attrs& attrs) {
  const DType dtype = compute_dtype(in, true);
  const Tensor a = as_dtype(in[0], dtype), b = as_dtype(in[1], dtype);
  const Reduction reduction = reduction_of(attrs);
  visit_floating(dtype, "mse_loss", [&]<class T>() {
    using C = compute_t<T>;
    if (reduction == Reduction::none) {
      into(out[0], dtype, [&](const Tensor& o) {
        map<T, T, T>(
            o, [](C x, C y) { return (x - y) * (x - y); }, a, b);
      });
      return;
    }
    if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) {
      const T* pa = a.data_ptr<T>();
      const T* pb = b.data_ptr<T>();
      const int64_t n = a.numel();
      const double sum = ordered_sum(n, 1, [pa, pb](int64_t i) {
        const double d =
            static_cast<double>(static_cast<C>(pa[i])) - static_cast<double>(static_cast<C>(pb[i]));
        return d * d;
      });
      Tensor(out[0]).fill_(reduction == Reduction::sum ? sum : n == 0 ? kNaN : sum / n);
      return;
    }
    // Broadcast or strided operands: the squares first, in the loop that handles both.
    const Shape ab[] = {a.shape(), b.shape()};
    const Tensor squares = make_tensor(broadcast_shapes(ab, "mse_loss"), DType::f64);
    map<double, T, T>(
        squares,
        [](C x, C y) {
          const double d = static_cast<double>(x) - static_cast<double>(y);
          return d * d;
        },
        a, b);
    const double* s = squares.data_ptr<double>();
    const int64_t n = squares.numel();
    const double sum = ordered_sum(n, 1, [s](int64_t i) { return s[i]; });
    Tensor(out[0]).fill_(reduction == Reduction::sum ? sum : n == 0 ? kNaN : sum / n);
  });
}

void mse_backward(Span in, Span out, const Attrs& attrs) {
  const DType dtype = compute_dtype(in.subspan(1), true);
  const Tensor g = as_dtype(in[0], dtype), a = as_dtype(in[1], dtype), b = as_dtype(in[2], dtype);
  const double scale =
      reduction_of(attrs) == Reduction::mean ? 2.0 / static_cast<double>(out[0].numel()) : 2.0;
  visit_floating(dtype, "mse_loss_backward", [&]<class T>() {
    using C = compute_t<T>;
    const C k = static_cast<C>(scale);
    into(out[0], dtype, [&](const Tensor& o) {
      map<T, T, T, T>(
          o, [k](C gv, C x, C y) { return k * (x - y) * gv; }, g, a, b);
    });
  });
}

constexpr char kNllLoss[] = "nll_loss";
constexpr char kCrossEntropyLoss[] = "cross_entropy_loss";
constexpr char kNllLossBackward[] = "nll_loss_backward";
constexpr char kCrossEntropyLossBackward[] = "cross_entropy_loss_backward";

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("nll_loss", cpu, class_index_loss<kNllLoss>);
    register_kernel("cross_entropy_loss", cpu, class_index_loss<kCrossEntropyLoss>);
    register_kernel("nll_loss_backward", cpu, class_index_backward<kNllLossBackward>);
    register_kernel("cross_entropy_loss_backward", cpu,
                    class_index_backward<kCrossEntropyLossBackward>);
    register_kernel("cross_entropy_prob_loss", cpu, prob_loss);
    register_kernel("cross_entropy_prob_loss_backward", cpu, prob_loss_backward);
    register_kernel("mse_loss", cpu, mse);
    register_kernel("mse_loss_backward", cpu, mse_backward);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
