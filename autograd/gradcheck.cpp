#include "autograd/gradcheck.h"

#include <cmath>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/reduce.h"

namespace kiln {

bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
               const std::vector<Tensor>& inputs, const GradcheckOptions& o) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    KILN_CHECK(x.dtype() == DType::f64, "gradcheck: input {} is {}; gradcheck needs f64", i,
               x.meta_str());
    KILN_CHECK(x.is_leaf(), "gradcheck: input {} ({}) must be a leaf", i, x.meta_str());
    KILN_CHECK(x.device().is_cpu(), "gradcheck: input {} ({}) must be on the CPU", i, x.meta_str());
    for (int64_t d = 0; d < x.dim(); ++d)
      KILN_CHECK(x.strides()[d] != 0 || x.shape()[d] <= 1,
                 "gradcheck: input {} ({}) has elements that share memory", i, x.meta_str());
  }
  Generator gen(o.seed);
  Tensor y = fn(inputs);
  KILN_CHECK(y.requires_grad(), "gradcheck: the output does not depend on any input that requires grad");
  const Tensor v = randn(y.shape(), {.dtype = y.dtype()}, &gen);
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad()) x.set_grad({});
  y.backward(v);

  NoGradGuard no_grad;
  auto objective = [&] { return sum(mul(fn(inputs).to(DType::f64), v.to(DType::f64))).item<double>(); };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    const Tensor analytic = (x.grad().defined() ? x.grad() : zeros_like(x)).to(DType::f64);
    for (int64_t flat = 0; flat < x.numel(); ++flat) {
      int64_t rem = flat, offset = 0, aoffset = 0;
      for (int64_t d = x.dim() - 1; d >= 0; --d) {
        const int64_t k = rem % x.shape()[d];
        rem /= x.shape()[d];
        offset += k * x.strides()[d];
        aoffset += k * analytic.strides()[d];
      }
      double* p = static_cast<double*>(x.storage()->data) + x.offset() + offset;
      const double saved = *p;
      *p = saved + o.eps;
      const double plus = objective();
      *p = saved - o.eps;
      const double minus = objective();
      *p = saved;
      const double numeric = (plus - minus) / (2 * o.eps);
      const double a = analytic.data_ptr<double>()[aoffset];
      KILN_CHECK(std::fabs(a - numeric) <= o.atol + o.rtol * std::fabs(numeric),
                 "gradcheck: input {} ({}), element {}: backward gives {} but finite differences "
                 "give {}",
                 i, x.meta_str(), flat, a, numeric);
    }
  }
  return true;
}

}  // namespace kiln
