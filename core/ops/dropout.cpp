// Dropout: the rule of the "dropout" op and the public functions. The backward is ordinary
// elementwise ops (grad * mask * scale), so it needs no op of its own.
#include "core/ops/dropout.h"

#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/registry.h"

namespace kiln {
namespace {

void check_probability(double p, const char* op) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "{}: probability p must be in [0, 1], got {}", op, p);
}

std::vector<TensorMeta> infer_dropout(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 1 && in[0].defined, "dropout: expects one tensor");
  const TensorMeta& x = in[0];
  KILN_CHECK(is_floating(x.dtype), "dropout: the input must be floating ({})", metas_str(in));
  const double p = a.f("p");
  KILN_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got {} ({})", p,
             metas_str(in));
  return {TensorMeta{x.shape, x.dtype, x.device}, TensorMeta{x.shape, DType::boolean, x.device}};
}
const OpDef& kDropout = define_op({.name = "dropout", .infer = infer_dropout, .random = true,
                                  .elementwise = Elementwise::opaque});

}  // namespace

std::pair<Tensor, Tensor> dropout_with_mask(const Tensor& x, double p, bool train,
                                            Generator* generator) {
  KILN_CHECK(x.defined(), "dropout: the input is undefined");
  check_probability(p, "dropout");
  if (!train) return {x, ones(x.shape(), {.dtype = DType::boolean, .device = x.device()})};
  Generator& gen = generator ? *generator : default_generator();
  const Generator::Reservation r = gen.reserve(static_cast<uint64_t>(x.numel()));
  const Attrs attrs{{"p", p},
                    {"train", true},
                    {"seed", static_cast<int64_t>(r.seed)},
                    {"offset", static_cast<int64_t>(r.offset)}};
  std::vector<Tensor> out = call_op(kDropout, {x}, attrs);
  return {out[0], out[1]};
}

Tensor dropout(const Tensor& x, double p, bool train, Generator* generator) {
  KILN_CHECK(x.defined(), "dropout: the input is undefined");
  check_probability(p, "dropout");
  if (!train) return x;
  return dropout_with_mask(x, p, train, generator).first;
}

Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double p) {
  check_probability(p, "dropout_backward");
  KILN_CHECK(mask.dtype() == DType::boolean, "dropout_backward: the mask must be bool, got {}",
             mask.meta_str());
  KILN_CHECK(grad.shape() == mask.shape(),
             "dropout_backward: grad {} and mask {} must have the same shape", grad.meta_str(),
             mask.meta_str());
  return mul(mul(grad, mask), dropout_scale(p));
}

}  // namespace kiln
