#include "optim/clip.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  KILN_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got {}", norm_type);
  const bool inf_norm = std::isinf(norm_type);
  double accumulated = 0.0;  // the largest |g| (inf norm) or the sum of |g|^p
  std::vector<Tensor> grads;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(is_floating(g.dtype()) && g.device().is_cpu(),
               "clip_grad_norm_: gradients must be floating CPU tensors, got {}", g.meta_str());
    grads.push_back(g);
    // The norm is summed here on the host, and the scale it gives becomes a number: a
    // traced step must not bake it in (compiler/trace.h, host reads).
    report_host_read(g, "clip_grad_norm_");
    const Tensor c = g.contiguous();
    visit_dtype(c.dtype(), [&]<class T>() {
      const T* data = static_cast<const T*>(c.data_ptr());
      for (int64_t i = 0; i < c.numel(); ++i) {
        const double a = std::abs(static_cast<double>(static_cast<compute_t<T>>(data[i])));
        if (inf_norm) accumulated = std::max(accumulated, a);
        else if (norm_type == 2.0) accumulated += a * a;
        else if (norm_type == 1.0) accumulated += a;
        else accumulated += std::pow(a, norm_type);
      }
    });
  }
  const double total = inf_norm             ? accumulated
                       : norm_type == 2.0   ? std::sqrt(accumulated)
                       : norm_type == 1.0   ? accumulated
                                            : std::pow(accumulated, 1.0 / norm_type);
  const double clip_coef = max_norm / (total + 1e-6);
  if (clip_coef < 1.0) {
    NoGradGuard no_grad;
    for (auto& g : grads) g.detach().mul_(clip_coef);
  }
  return total;
}

}  // namespace kiln::optim
