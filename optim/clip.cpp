#include "optim/clip.h"

#include <cmath>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/reduce.h"

namespace kiln::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  KILN_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got {}", norm_type);
  KILN_CHECK(std::isfinite(max_norm) && max_norm >= 0,
             "clip_grad_norm_: max_norm must be finite and not negative, got {}", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads, norms;
  for (const auto& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(is_floating(g.dtype()), "clip_grad_norm_: gradients must be floating, got {}", g.meta_str());
    KILN_CHECK(grads.empty() || g.device() == grads[0].device(),
               "clip_grad_norm_: gradients on {} and {}; clip the parameters of one device at a time",
               grads[0].device().str(), g.device().str());
    grads.push_back(g.detach());
    // Each gradient's norm (the kernels accumulate in f64 and round once), then in f64; f16
    // gradients in f32 first, whose norm could pass f16's largest number.
    const Tensor d = g.dtype() == DType::f16 ? g.detach().to(DType::f32) : g.detach();
    norms.push_back(norm(d, norm_type).to(DType::f64));
  }
  if (grads.empty()) return zeros({}, {.dtype = DType::f64});
  const Tensor total = norms.size() == 1 ? norms[0] : norm(stack(norms), norm_type);
  // min(1, coef) multiplies every time: a factor of 1 leaves the values exactly, and no
  // branch on the norm means no read of it on the host.
  const Tensor coef = clamp_max(max_norm / (total + 1e-6), 1.0);
  for (Tensor& g : grads) g.mul_(coef.to(g.dtype()));
  return total;
}

}  // namespace kiln::optim
