#include "optim/adamw.h"

#include <cmath>

#include "core/error.h"
#include "core/ops/factory.h"
#include "kernels/cpu/parallel.h"

namespace kiln::optim {

namespace {
std::map<std::string, double> adamw_defaults(const AdamWOptions& o) {
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

// The whole AdamW update of one parameter in one pass over its elements, in T's precision
// (the scalar factors are computed in f64 first, as PyTorch computes them in Python).
// `vmax` is null without amsgrad.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, bool maximize, double step) {
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T one_minus_b1 = static_cast<T>(1.0 - beta1), b2 = static_cast<T>(beta2),
          one_minus_b2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / (1.0 - std::pow(beta1, step)));
  const T correction2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(beta2, step)));
  const T eps_t = static_cast<T>(eps);
  cpu::parallel_for(n, cpu::kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T grad = maximize ? -g[i] : g[i];
      T param = p[i] * decay;
      m[i] = m[i] + one_minus_b1 * (grad - m[i]);
      v[i] = v[i] * b2 + one_minus_b2 * grad * grad;
      T second = v[i];
      if (vmax) {
        vmax[i] = std::max(vmax[i], v[i]);
        second = vmax[i];
      }
      const T denom = std::sqrt(second) / correction2_sqrt + eps_t;
      p[i] = param - step_size * (m[i] / denom);
    }
  });
}

// The state tensor `name` of a parameter, zeros like `p` when new.
Tensor& state_tensor(ParamState& state, const std::string& name, const Tensor& p) {
  Tensor& t = state[name];
  if (!t.defined()) t = zeros_like(p);
  return t;
}
}  // namespace

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroupSpec>{{params, {}}}, options) {}

AdamW::AdamW(const std::vector<ParamGroupSpec>& groups, AdamWOptions options)
    : Optimizer("AdamW", adamw_defaults(options)) {
  for (const auto& group : groups) add_param_group(group);
}

void AdamW::check_group(const ParamGroup& group) const {
  KILN_CHECK(group.lr() >= 0, "AdamW: invalid lr {}", group.lr());
  KILN_CHECK(group.get("eps") >= 0, "AdamW: invalid eps {}", group.get("eps"));
  for (const char* beta : {"beta1", "beta2"})
    KILN_CHECK(group.get(beta) >= 0 && group.get(beta) < 1, "AdamW: invalid {} {}", beta,
               group.get(beta));
  KILN_CHECK(group.weight_decay() >= 0, "AdamW: invalid weight_decay {}", group.weight_decay());
}

void AdamW::step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, const std::vector<ParamState*>& states) {
  const double lr = group.lr(), beta1 = group.get("beta1"), beta2 = group.get("beta2"),
               eps = group.get("eps"), weight_decay = group.weight_decay();
  const bool amsgrad = group.get("amsgrad") != 0, maximize = group.get("maximize") != 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    ParamState& state = *states[i];
    Tensor& step = state["step"];
    if (!step.defined()) step = scalar_tensor(0.0, DType::f64);
    step.data_ptr<double>()[0] += 1;
    const double t = step.item<double>();
    Tensor& m = state_tensor(state, "exp_avg", p);
    Tensor& v = state_tensor(state, "exp_avg_sq", p);
    Tensor vmax = amsgrad ? state_tensor(state, "max_exp_avg_sq", p) : Tensor();
    visit_dtype(p.dtype(), [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        adamw_update<T>(p.data_ptr<T>(), grads[i].data_ptr<T>(), m.data_ptr<T>(),
                        v.data_ptr<T>(), vmax.defined() ? vmax.data_ptr<T>() : nullptr, p.numel(),
                        lr, beta1, beta2, eps, weight_decay, maximize, t);
      } else {
        fail("AdamW.step: parameters must be f32 or f64, got {}", p.meta_str());
      }
    });
  }
}

}  // namespace kiln::optim
