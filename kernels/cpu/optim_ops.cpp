// CPU kernels of the optimizer updates (core/ops/optim_ops.h). Each update is one pass over
// a parameter's elements that reads the old values and writes the new ones; the in-place
// form writes them over the old ones (same pointers), the pure form into fresh outputs, so
// both compute the same numbers. The element arithmetic is kernels/scalar.h's (in the
// parameter's dtype, as torch's single-tensor optimizers compute it), from the per-step
// factors of kernels/optim_factors.h; the CUDA kernels run the same two.
//
// The multi-tensor forms run the same element loop over a work list of chunks that covers
// every parameter of the call, in one parallel region (not one per parameter). The loop over
// an element range is one out-of-line function per dtype that both forms call, so that a
// parameter's result is bit for bit the single op's however the elements are split.
#include <omp.h>

#include <algorithm>
#include <array>

#include "core/ops/optim_ops.h"
#include "core/registry.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/wide.h"
#include "kernels/optim_factors.h"
#include "kernels/scalar.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

// The loops run over flat memory: every tensor of one parameter's update must lie in the
// memory order of the tensor written first (the new parameter), which is dense: contiguous
// or channels_last (a model converted with Module::to(MemoryFormat::channels_last)).
bool dense(const Tensor& t) { return t.is_contiguous() || t.is_contiguous(MemoryFormat::channels_last); }

// Whether t's elements lie in `like`'s memory order (same strides on every dim of size
// above 1, `like` dense), so that one flat index walks both alike.
bool dense_like(const Tensor& t, const Tensor& like) {
  if (t.shape() != like.shape()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != like.stride(d)) return false;
  return dense(like);
}

// A tensor the update reads, in `like`'s memory order (a copy when it is not). Null when absent.
template <class T>
const T* read_ptr(const Tensor& t, Tensor& keep, const Tensor& like) {
  if (!t.defined()) return nullptr;
  keep = dense_like(t, like) ? t : t.contiguous(like.is_contiguous() ? MemoryFormat::contiguous : MemoryFormat::channels_last);
  return keep.data_ptr<T>();
}

// A tensor the in-place form writes: dense, and in the parameter's memory order, as the
// loop writes flat.
void check_writable(const Tensor& t, const Tensor& param, const std::string& what, const char* op) {
  if (!t.defined()) return;
  KILN_CHECK(dense(t), "{}: {} must be contiguous or channels_last to be updated in place, got {} (strides {})", op,
             what, t.meta_str(), shape_str(t.strides()));
  KILN_CHECK(dense_like(t, param),
             "{}: {} must lie in its parameter's memory order to be updated in place, got strides {} against the "
             "parameter's {} ({})",
             op, what, shape_str(t.strides()), shape_str(param.strides()), t.meta_str());
}

// Whether a skipped step (found_inf nonzero, core/ops/optim_ops.h) leaves this call's
// outputs as they were: read when the kernel runs, never at trace time. The shape rule put
// found_inf on the CPU (a CPU parameter's device).
bool skipped(const Tensor& found_inf) { return found_inf.defined() && found_inf.item<float>() != 0.0f; }

// A skipped pure form returns the values it was given: out[i] = in[i] where out[i] is the
// new value of input in[i] (nothing to do for the in-place forms, whose outputs are inputs).
void copy_unchanged(std::initializer_list<std::pair<Tensor, Tensor>> pairs) {
  for (const auto& [out, in] : pairs)
    if (out.defined() && !out.same(in)) Tensor(out).copy_(in);
}

// The multi-tensor forms' work list: chunks of at most kChunk elements of one parameter
// each, over all parameters. The chunks go to the threads dynamically (parameter sizes
// vary from a few to millions of elements); small calls run on the calling thread, as
// parallel_for does.
constexpr int64_t kChunk = 65536;

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

template <class F>
void for_each_chunk(const std::vector<int64_t>& sizes, F&& f) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int64_t begin = 0; begin < sizes[k]; begin += kChunk)
      chunks.push_back({k, begin, std::min(sizes[k], begin + kChunk)});
    total += sizes[k];
  }
  const auto n = static_cast<int64_t>(chunks.size());
  if (total <= kGrain || n == 1 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (const Chunk& c : chunks) f(c);
    return;
  }
  const int64_t threads = std::min<int64_t>({omp_get_max_threads(), n, (total + kGrain - 1) / kGrain});
#pragma omp parallel for num_threads(static_cast<int>(threads)) schedule(dynamic, 1)
  for (int64_t c = 0; c < n; ++c) f(chunks[static_cast<size_t>(c)]);
}

// ---- SGD ----

// Old values in, new values out; out pointers may equal in pointers (the in-place form).
template <class T>
struct SGDPointers {
  const T *p, *g, *buf;
  T *p_out, *buf_out;  // buf_out null without momentum
};

// The f64 factors rounded to T. in: (param, grad, momentum_buffer?, lr, momentum,
// dampening, weight_decay).
template <class T>
scalar::SgdFactors<T> sgd_constants(Span in, const Attrs& attrs) {
  return scalar::in_dtype<T>(sgd_factors(in.subspan(3, 4), attrs));
}

// The update of elements [begin, end): out of line, so that the single and the multi-tensor
// forms run the same machine code on every element (see the top of the file). The factors
// come by value: a copy that the loop's stores cannot alias, so the loop vectorizes.
template <class T>
[[gnu::noinline]] void sgd_range(const SGDPointers<T>& x, const scalar::SgdFactors<T> c, int64_t begin,
                                 int64_t end) {
  if (!x.buf_out) {
    for (int64_t i = begin; i < end; ++i) x.p_out[i] = scalar::sgd_update<T>(x.p[i], x.g[i], nullptr, c);
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    T buf = x.buf[i];
    x.p_out[i] = scalar::sgd_update(x.p[i], x.g[i], &buf, c);
    x.buf_out[i] = buf;
  }
}

// One parameter's pointers; `keep` holds contiguous copies of inputs that were not.
template <class T>
SGDPointers<T> sgd_pointers(Span in, const Tensor& p_out, const Tensor& buf_out, std::array<Tensor, 3>& keep) {
  return {read_ptr<T>(in[0], keep[0], p_out), read_ptr<T>(in[1], keep[1], p_out), read_ptr<T>(in[2], keep[2], p_out),
          p_out.data_ptr<T>(), buf_out.defined() ? buf_out.data_ptr<T>() : nullptr};
}

template <class T>
constexpr bool kUpdatable = std::is_same_v<T, float> || std::is_same_v<T, double>;

// in: (param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay); writes into
// p_out and buf_out (the inputs themselves for the in-place form).
void run_sgd(Span in, const Tensor& p_out, const Tensor& buf_out, const Attrs& attrs) {
  visit_floating(in[0].dtype(), "sgd_update", [&]<class T>() {
    if constexpr (kUpdatable<T>) {
      std::array<Tensor, 3> keep;
      const SGDPointers<T> x = sgd_pointers<T>(in, p_out, buf_out, keep);
      const scalar::SgdFactors<T> c = sgd_constants<T>(in, attrs);
      parallel_for(in[0].numel(), kGrain, [&](int64_t begin, int64_t end) { sgd_range<T>(x, c, begin, end); });
    } else {
      fail("sgd_update: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

void sgd_update_inplace(Span in, Span, const Attrs& attrs) {
  check_writable(in[0], in[0], "param", "sgd_update_");
  check_writable(in[2], in[0], "momentum_buffer", "sgd_update_");
  if (skipped(found_inf_input(in, 7))) return;
  run_sgd(in, in[0], in[2], attrs);
}

void sgd_update(Span in, Span out, const Attrs& attrs) {
  const Tensor buf_out = out.size() > 1 ? out[1] : Tensor();
  if (skipped(found_inf_input(in, 7))) return copy_unchanged({{out[0], in[0]}, {buf_out, in[2]}});
  run_sgd(in, out[0], buf_out, attrs);
}

// The multi-tensor form: outs(k) gives parameter k's (p_out, buf_out). The shape rule made
// every parameter of one dtype.
template <class Outs>
void run_sgd_multi(Span in, const Attrs& attrs, Outs outs) {
  const int64_t count = attrs.i("count");
  visit_floating(in[0].dtype(), "sgd_update_multi", [&]<class T>() {
    if constexpr (kUpdatable<T>) {
      std::vector<SGDPointers<T>> pointers;
      std::vector<int64_t> sizes;
      std::vector<std::array<Tensor, 3>> keep(static_cast<size_t>(count));
      for (int64_t k = 0; k < count; ++k) {
        const std::vector<Tensor> single = sgd_single_inputs(in, count, k);
        const auto [p_out, buf_out] = outs(k);
        pointers.push_back(sgd_pointers<T>(single, p_out, buf_out, keep[static_cast<size_t>(k)]));
        sizes.push_back(single[0].numel());
      }
      const scalar::SgdFactors<T> c = sgd_constants<T>(sgd_single_inputs(in, count, 0), attrs);
      for_each_chunk(sizes, [&](const Chunk& ch) { sgd_range<T>(pointers[ch.tensor], c, ch.begin, ch.end); });
    } else {
      fail("sgd_update_multi: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

// in: (param x N, grad x N, momentum_buffer x N?, hyperparameters).
void sgd_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  for (int64_t k = 0; k < n; ++k) {
    check_writable(in[static_cast<size_t>(k)], in[static_cast<size_t>(k)], fmt::format("param {}", k),
                   "sgd_update_multi_");
    check_writable(in[static_cast<size_t>(2 * n + k)], in[static_cast<size_t>(k)], fmt::format("momentum_buffer {}", k),
                   "sgd_update_multi_");
  }
  if (skipped(found_inf_input(in, static_cast<size_t>(3 * n + 4)))) return;
  run_sgd_multi(in, attrs, [&](int64_t k) {
    return std::pair{in[static_cast<size_t>(k)], in[static_cast<size_t>(2 * n + k)]};
  });
}

// out: (new_param x N, new_momentum_buffer x N if given).
void sgd_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  if (skipped(found_inf_input(in, static_cast<size_t>(3 * n + 4)))) {
    for (size_t i = 0; i < out.size(); ++i)  // outputs: params, then buffers (inputs 2n..3n-1)
      copy_unchanged({{out[i], in[i < static_cast<size_t>(n) ? i : i + static_cast<size_t>(n)]}});
    return;
  }
  run_sgd_multi(in, attrs, [&](int64_t k) {
    const Tensor buf = static_cast<int64_t>(out.size()) > n ? out[static_cast<size_t>(n + k)] : Tensor();
    return std::pair{out[static_cast<size_t>(k)], buf};
  });
}

// ---- AdamW ----

template <class T>
struct AdamWPointers {
  const T *p, *g, *m, *v, *vmax;
  T *p_out, *m_out, *v_out, *vmax_out;  // vmax_out null without amsgrad
};

// The f64 factors rounded to T. in: (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?,
// step, lr, beta1, beta2, eps, weight_decay).
template <class T>
scalar::AdamWFactors<T> adamw_constants(Span in, const Attrs& attrs) {
  return scalar::in_dtype<T>(adamw_factors(in[5], in.subspan(6, 5), attrs));
}

// The element loop of adamw_range with maximize and amsgrad fixed, so that nothing in it
// branches. Each element is read and written at its own index only (the in-place form
// writes over the elements it read: the same pointers), so the iterations are independent.
template <class T, bool kMaximize, bool kAmsgrad>
[[gnu::always_inline]] inline void adamw_elements(const AdamWPointers<T>& x, scalar::AdamWFactors<T> f,
                                                  int64_t begin, int64_t end) {
  f.maximize = kMaximize;
  // The pointers in locals: loaded once, not after every store.
  const T *p = x.p, *g = x.g, *m_in = x.m, *v_in = x.v, *vmax_in = x.vmax;
  T *p_out = x.p_out, *m_out = x.m_out, *v_out = x.v_out, *vmax_out = x.vmax_out;
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    T m = m_in[i], v = v_in[i], vmax = kAmsgrad ? vmax_in[i] : T(0);
    p_out[i] = scalar::adamw_update(p[i], g[i], m, v, kAmsgrad ? &vmax : nullptr, f);
    m_out[i] = m;
    v_out[i] = v;
    if constexpr (kAmsgrad) vmax_out[i] = vmax;
  }
}

// As sgd_range: one out-of-line loop that both forms run. Where the CPU has AVX-512 it runs
// the loop's AVX-512 build (16 f32 lanes; no FMA contraction, so the same bits as the
// plain build and as the CUDA kernel): the plain build's square roots and divisions made
// the update twice as slow as its memory traffic.
template <class T>
[[gnu::noinline]] void adamw_range(const AdamWPointers<T>& x, const scalar::AdamWFactors<T> f, int64_t begin,
                                   int64_t end) {
  auto run = [&]<bool kMaximize, bool kAmsgrad>() {
    auto loop = [&]() __attribute__((always_inline)) { adamw_elements<T, kMaximize, kAmsgrad>(x, f, begin, end); };
    if (wide_loops()) return call_wide(loop);
    loop();
  };
  if (x.vmax_out)
    f.maximize ? run.template operator()<true, true>() : run.template operator()<false, true>();
  else
    f.maximize ? run.template operator()<true, false>() : run.template operator()<false, false>();
}

// out: where the new param, exp_avg, exp_avg_sq, max_exp_avg_sq go (the last undefined
// without amsgrad).
template <class T>
AdamWPointers<T> adamw_pointers(Span in, const Tensor* out, std::array<Tensor, 5>& keep) {
  return {read_ptr<T>(in[0], keep[0], out[0]), read_ptr<T>(in[1], keep[1], out[0]), read_ptr<T>(in[2], keep[2], out[0]),
          read_ptr<T>(in[3], keep[3], out[0]), read_ptr<T>(in[4], keep[4], out[0]), out[0].data_ptr<T>(),
          out[1].data_ptr<T>(),        out[2].data_ptr<T>(),        out[3].defined() ? out[3].data_ptr<T>() : nullptr};
}

void run_adamw(Span in, const Tensor* out, const Attrs& attrs) {
  visit_floating(in[0].dtype(), "adamw_update", [&]<class T>() {
    if constexpr (kUpdatable<T>) {
      std::array<Tensor, 5> keep;
      const AdamWPointers<T> x = adamw_pointers<T>(in, out, keep);
      const scalar::AdamWFactors<T> f = adamw_constants<T>(in, attrs);
      parallel_for(in[0].numel(), kGrain, [&](int64_t begin, int64_t end) { adamw_range<T>(x, f, begin, end); });
    } else {
      fail("adamw_update: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

void adamw_update_inplace(Span in, Span, const Attrs& attrs) {
  const char* what[] = {"param", "", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  for (int i : {0, 2, 3, 4}) check_writable(in[static_cast<size_t>(i)], in[0], what[i], "adamw_update_");
  if (skipped(found_inf_input(in, 11))) return;
  const Tensor out[] = {in[0], in[2], in[3], in[4]};
  run_adamw(in, out, attrs);
}

void adamw_update(Span in, Span out, const Attrs& attrs) {
  const Tensor outs[] = {out[0], out[1], out[2], out.size() > 3 ? out[3] : Tensor()};
  if (skipped(found_inf_input(in, 11)))
    return copy_unchanged({{outs[0], in[0]}, {outs[1], in[2]}, {outs[2], in[3]}, {outs[3], in[4]}});
  run_adamw(in, outs, attrs);
}

// The multi-tensor form: outs(k) gives parameter k's four outputs. Each parameter has its
// own step count, so its own factors.
template <class Outs>
void run_adamw_multi(Span in, const Attrs& attrs, Outs outs) {
  const int64_t count = attrs.i("count");
  visit_floating(in[0].dtype(), "adamw_update_multi", [&]<class T>() {
    if constexpr (kUpdatable<T>) {
      std::vector<AdamWPointers<T>> pointers;
      std::vector<scalar::AdamWFactors<T>> factors;
      std::vector<int64_t> sizes;
      std::vector<std::array<Tensor, 5>> keep(static_cast<size_t>(count));
      for (int64_t k = 0; k < count; ++k) {
        const std::vector<Tensor> single = adamw_single_inputs(in, count, k);
        const std::array<Tensor, 4> out = outs(k);
        pointers.push_back(adamw_pointers<T>(single, out.data(), keep[static_cast<size_t>(k)]));
        factors.push_back(adamw_constants<T>(single, attrs));
        sizes.push_back(single[0].numel());
      }
      for_each_chunk(sizes, [&](const Chunk& ch) {
        adamw_range<T>(pointers[ch.tensor], factors[ch.tensor], ch.begin, ch.end);
      });
    } else {
      fail("adamw_update_multi: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

// in: (param x N, grad x N, exp_avg x N, exp_avg_sq x N, max_exp_avg_sq x N?, step x N,
// hyperparameters).
void adamw_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const char* what[] = {"param", "", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  for (int64_t role : {0, 2, 3, 4})
    for (int64_t k = 0; k < n; ++k)
      check_writable(in[static_cast<size_t>(role * n + k)], in[static_cast<size_t>(k)], fmt::format("{} {}", what[role], k),
                     "adamw_update_multi_");
  if (skipped(found_inf_input(in, static_cast<size_t>(6 * n + 5)))) return;
  run_adamw_multi(in, attrs, [&](int64_t k) {
    auto at = [&](int64_t role) { return in[static_cast<size_t>(role * n + k)]; };
    return std::array<Tensor, 4>{at(0), at(2), at(3), at(4)};
  });
}

// out: (new_param x N, new_exp_avg x N, new_exp_avg_sq x N, new_max_exp_avg_sq x N if given).
void adamw_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  if (skipped(found_inf_input(in, static_cast<size_t>(6 * n + 5)))) {
    // outputs: role r's new values (params, exp_avg, exp_avg_sq, max_exp_avg_sq) are inputs
    // of roles 0, 2, 3, 4
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t role = i / static_cast<size_t>(n), k = i % static_cast<size_t>(n);
      copy_unchanged({{out[i], in[(role == 0 ? 0 : role + 1) * static_cast<size_t>(n) + k]}});
    }
    return;
  }
  run_adamw_multi(in, attrs, [&](int64_t k) {
    auto at = [&](int64_t role) {
      const auto i = static_cast<size_t>(role * n + k);
      return i < out.size() ? out[i] : Tensor();
    };
    return std::array<Tensor, 4>{at(0), at(1), at(2), at(3)};
  });
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("sgd_update_", cpu, sgd_update_inplace);
    register_kernel("sgd_update", cpu, sgd_update);
    register_kernel("adamw_update_", cpu, adamw_update_inplace);
    register_kernel("adamw_update", cpu, adamw_update);
    register_kernel("sgd_update_multi_", cpu, sgd_update_multi_inplace);
    register_kernel("sgd_update_multi", cpu, sgd_update_multi);
    register_kernel("adamw_update_multi_", cpu, adamw_update_multi_inplace);
    register_kernel("adamw_update_multi", cpu, adamw_update_multi);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
