// CPU kernels of the optimizer updates (core/ops/optim_ops.h). Each update is one pass over
// a parameter's elements that reads the old values and writes the new ones; the in-place
// form writes them over the old ones (same pointers), the pure form into fresh outputs, so
// both compute the same numbers. The element arithmetic is in the parameter's dtype, as
// torch's single-tensor optimizers compute it.
#include <algorithm>
#include <cmath>

#include "core/registry.h"
#include "kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using Span = std::span<const Tensor>;

double scalar_of(const Tensor& t) { return t.item<double>(); }

// A tensor the update reads: contiguous (a copy when the tensor is not). Null when absent.
template <class T>
const T* read_ptr(const Tensor& t, Tensor& keep) {
  if (!t.defined()) return nullptr;
  keep = t.contiguous();
  return keep.data_ptr<T>();
}

// A tensor the in-place form writes: it must be contiguous, as the loop writes flat.
void check_writable(const Tensor& t, const char* what, const char* op) {
  if (!t.defined()) return;
  KILN_CHECK(t.is_contiguous(), "{}: {} must be contiguous to be updated in place, got {} (strides {})",
             op, what, t.meta_str(), shape_str(t.strides()));
}

// Old values in, new values out; out pointers may equal in pointers (the in-place form).
template <class T>
struct SGDPointers {
  const T *p, *g, *buf;
  T *p_out, *buf_out;  // buf_out null without momentum
};

template <class T>
void sgd_loop(const SGDPointers<T>& x, int64_t n, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool maximize, bool first) {
  const T lr_t = static_cast<T>(lr), m = static_cast<T>(momentum),
          damp = static_cast<T>(1.0 - dampening), wd = static_cast<T>(weight_decay);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = maximize ? -x.g[i] : x.g[i];
      if (weight_decay != 0) d = d + wd * x.p[i];
      if (x.buf_out) {
        const T buf = first ? d : m * x.buf[i] + damp * d;
        x.buf_out[i] = buf;
        d = nesterov ? d + m * buf : buf;
      }
      x.p_out[i] = x.p[i] - lr_t * d;
    }
  });
}

// in: (param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay); writes into
// p_out and buf_out (the inputs themselves for the in-place form).
void run_sgd(Span in, const Tensor& p_out, const Tensor& buf_out, const Attrs& attrs) {
  const double lr = scalar_of(in[3]), momentum = scalar_of(in[4]), dampening = scalar_of(in[5]),
               weight_decay = scalar_of(in[6]);
  const bool nesterov = attrs.b("nesterov"), maximize = attrs.b("maximize"),
             first = attrs.b("first");
  visit_floating(in[0].dtype(), "sgd_update", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      Tensor p, g, buf;
      const SGDPointers<T> x{read_ptr<T>(in[0], p), read_ptr<T>(in[1], g), read_ptr<T>(in[2], buf),
                             p_out.data_ptr<T>(), buf_out.defined() ? buf_out.data_ptr<T>() : nullptr};
      sgd_loop<T>(x, in[0].numel(), lr, momentum, dampening, weight_decay, nesterov, maximize, first);
    } else {
      fail("sgd_update: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

void sgd_update_inplace(Span in, Span, const Attrs& attrs) {
  check_writable(in[0], "param", "sgd_update_");
  check_writable(in[2], "momentum_buffer", "sgd_update_");
  run_sgd(in, in[0], in[2], attrs);
}

void sgd_update(Span in, Span out, const Attrs& attrs) {
  run_sgd(in, out[0], out.size() > 1 ? out[1] : Tensor(), attrs);
}

template <class T>
struct AdamWPointers {
  const T *p, *g, *m, *v, *vmax;
  T *p_out, *m_out, *v_out, *vmax_out;  // vmax_out null without amsgrad
};

// The scalar factors in f64 first (as PyTorch computes them in Python), then the elementwise
// work in T.
template <class T>
void adamw_loop(const AdamWPointers<T>& x, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, bool maximize, double step) {
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T one_minus_b1 = static_cast<T>(1.0 - beta1), b2 = static_cast<T>(beta2),
          one_minus_b2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / (1.0 - std::pow(beta1, step)));
  const T correction2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(beta2, step)));
  const T eps_t = static_cast<T>(eps);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T grad = maximize ? -x.g[i] : x.g[i];
      const T param = x.p[i] * decay;
      const T m = x.m[i] + one_minus_b1 * (grad - x.m[i]);
      const T v = x.v[i] * b2 + one_minus_b2 * grad * grad;
      x.m_out[i] = m;
      x.v_out[i] = v;
      T second = v;
      if (x.vmax_out) {
        second = std::max(x.vmax[i], v);
        x.vmax_out[i] = second;
      }
      const T denom = std::sqrt(second) / correction2_sqrt + eps_t;
      x.p_out[i] = param - step_size * (m / denom);
    }
  });
}

// in: (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step, lr, beta1, beta2, eps,
// weight_decay); out: where the new param, exp_avg, exp_avg_sq, max_exp_avg_sq go.
void run_adamw(Span in, const Tensor* out, const Attrs& attrs) {
  const double step = scalar_of(in[5]), lr = scalar_of(in[6]), beta1 = scalar_of(in[7]),
               beta2 = scalar_of(in[8]), eps = scalar_of(in[9]), weight_decay = scalar_of(in[10]);
  const bool maximize = attrs.b("maximize");
  visit_floating(in[0].dtype(), "adamw_update", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      Tensor p, g, m, v, vmax;
      const AdamWPointers<T> x{read_ptr<T>(in[0], p),  read_ptr<T>(in[1], g),
                               read_ptr<T>(in[2], m),  read_ptr<T>(in[3], v),
                               read_ptr<T>(in[4], vmax), out[0].data_ptr<T>(),
                               out[1].data_ptr<T>(),   out[2].data_ptr<T>(),
                               out[3].defined() ? out[3].data_ptr<T>() : nullptr};
      adamw_loop<T>(x, in[0].numel(), lr, beta1, beta2, eps, weight_decay, maximize, step);
    } else {
      fail("adamw_update: parameters must be f32 or f64, got {}", in[0].meta_str());
    }
  });
}

void adamw_update_inplace(Span in, Span, const Attrs& attrs) {
  const char* what[] = {"param", "", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  for (int i : {0, 2, 3, 4}) check_writable(in[static_cast<size_t>(i)], what[i], "adamw_update_");
  const Tensor out[] = {in[0], in[2], in[3], in[4]};
  run_adamw(in, out, attrs);
}

void adamw_update(Span in, Span out, const Attrs& attrs) {
  const Tensor outs[] = {out[0], out[1], out[2], out.size() > 3 ? out[3] : Tensor()};
  run_adamw(in, outs, attrs);
}

struct Registrar {
  Registrar() {
    constexpr auto cpu = DeviceType::cpu;
    register_kernel("sgd_update_", cpu, sgd_update_inplace);
    register_kernel("sgd_update", cpu, sgd_update);
    register_kernel("adamw_update_", cpu, adamw_update_inplace);
    register_kernel("adamw_update", cpu, adamw_update);
  }
} registrar;

}  // namespace
}  // namespace kiln::cpu
