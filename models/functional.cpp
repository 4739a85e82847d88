// nn::functional::linear and matmul_bias; everything else in nn::functional is an op of core/ops.
#include "models/functional.h"

#include "core/autocast.h"
#include "core/error.h"

namespace kiln::nn::functional {

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(x.defined() && weight.defined(), "linear: input and weight must be defined");
  KILN_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear: input {} and weight {} do not match (weight is [out, in], the input's "
             "last dim is in)",
             x.meta_str(), weight.meta_str());
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
             "linear: bias {} does not match weight {}", bias.meta_str(), weight.meta_str());
  return matmul_bias(x, weight.t(), bias);
}

Tensor matmul_bias(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!bias.defined()) return matmul(x, weight);
  if (x.dim() >= 1 && autocast_dtype(x.device().type) && is_floating(x.dtype())) {
    Shape shape = x.shape();
    shape.back() = weight.size(1);
    return addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(shape);
  }
  return matmul(x, weight) + bias;
}

}  // namespace kiln::nn::functional
