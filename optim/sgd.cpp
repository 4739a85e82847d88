#include "optim/sgd.h"

#include "core/error.h"
#include "core/ops/factory.h"
#include "kernels/cpu/parallel.h"

namespace kiln::optim {

namespace {
std::map<std::string, double> sgd_defaults(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

// The whole SGD update of one parameter in one pass over its elements. `buf` is null
// without momentum; `first` says the buffer is new (it takes the gradient as it is).
template <class T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool maximize, bool first) {
  const T lr_t = static_cast<T>(lr), m = static_cast<T>(momentum),
          damp = static_cast<T>(1.0 - dampening), wd = static_cast<T>(weight_decay);
  cpu::parallel_for(n, cpu::kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = maximize ? -g[i] : g[i];
      if (weight_decay != 0) d = d + wd * p[i];
      if (buf) {
        buf[i] = first ? d : m * buf[i] + damp * d;
        d = nesterov ? d + m * buf[i] : buf[i];
      }
      p[i] = p[i] - lr_t * d;
    }
  });
}
}  // namespace

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options)
    : SGD(std::vector<ParamGroupSpec>{{params, {}}}, options) {}

SGD::SGD(const std::vector<ParamGroupSpec>& groups, SGDOptions options)
    : Optimizer("SGD", sgd_defaults(options)) {
  for (const auto& group : groups) add_param_group(group);
}

void SGD::check_group(const ParamGroup& group) const {
  KILN_CHECK(group.lr() >= 0, "SGD: invalid lr {}", group.lr());
  KILN_CHECK(group.get("momentum") >= 0, "SGD: invalid momentum {}", group.get("momentum"));
  KILN_CHECK(group.weight_decay() >= 0, "SGD: invalid weight_decay {}", group.weight_decay());
  if (group.get("nesterov") != 0)
    KILN_CHECK(group.get("momentum") > 0 && group.get("dampening") == 0,
               "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})",
               group.get("momentum"), group.get("dampening"));
}

void SGD::step_group(const ParamGroup& group, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, const std::vector<ParamState*>& states) {
  const double lr = group.lr(), momentum = group.get("momentum"),
               dampening = group.get("dampening"), weight_decay = group.weight_decay();
  const bool nesterov = group.get("nesterov") != 0, maximize = group.get("maximize") != 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor buf;
    bool first = false;
    if (momentum != 0) {
      auto it = states[i]->find("momentum_buffer");
      first = it == states[i]->end();
      if (first) buf = (*states[i])["momentum_buffer"] = zeros_like(p);
      else buf = it->second;
    }
    visit_dtype(p.dtype(), [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        sgd_update<T>(p.data_ptr<T>(), grads[i].data_ptr<T>(),
                      buf.defined() ? buf.data_ptr<T>() : nullptr, p.numel(), lr, momentum,
                      dampening, weight_decay, nesterov, maximize, first);
      } else {
        fail("SGD.step: parameters must be f32 or f64, got {}", p.meta_str());
      }
    });
  }
}

}  // namespace kiln::optim
