// linear_cross_entropy and its backward op: shape rules and public functions.
#include "core/ops/linear_cross_entropy.h"

#include "core/registry.h"

namespace kiln {
namespace {

constexpr const char* kForward = "linear_cross_entropy";
constexpr const char* kBackward = "linear_cross_entropy_backward";

// (input, weight, bias?, target): checks them and returns (M, V).
std::pair<int64_t, int64_t> check_operands(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  const std::string& r = a.str("reduction");
  KILN_CHECK(r == "mean" || r == "sum", "{}: reduction must be \"mean\" or \"sum\", got \"{}\"", op, r);
  a.i("ignore_index");
  const TensorMeta &x = in[0], &w = in[1], &b = in[2], &t = in[3];
  KILN_CHECK(x.defined && w.defined && t.defined,
             "{}: expects (input, weight, bias?, target), got {}", op, metas_str(in));
  KILN_CHECK((x.dtype == DType::f32 || x.dtype == DType::f64) && w.dtype == x.dtype &&
                 (!b.defined || b.dtype == x.dtype),
             "{}: input, weight and bias must all be f32 or all f64, got {}", op, metas_str(in));
  KILN_CHECK(x.shape.size() == 2 && w.shape.size() == 2 && w.shape[1] == x.shape[1],
             "{}: input must be [M, H] and weight [V, H], got {}", op, metas_str(in));
  const int64_t m = x.shape[0], v = w.shape[0];
  KILN_CHECK(!b.defined || b.shape == Shape{v}, "{}: bias must be [{}], got {}", op, v, metas_str(in));
  KILN_CHECK(t.dtype == DType::i64 && t.shape == Shape{m},
             "{}: target must be i64 [{}] class indices, got {}", op, m, metas_str(in));
  common_device(in, op);
  return {m, v};
}

// (input, weight, bias?, target) -> (loss, correct, log_sum_exp, logits)
std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 4, "{}: expects (input, weight, bias?, target), got {}", kForward, metas_str(in));
  const auto [m, v] = check_operands(in, a, kForward);
  const Device d = in[0].device;
  return {TensorMeta{{}, in[0].dtype, d}, TensorMeta{{}, DType::i64, d}, TensorMeta{{m}, DType::f64, d},
          TensorMeta{{m, v}, in[0].dtype, d}};
}

// (grad_loss, input, weight, bias?, target, log_sum_exp, logits) -> (grad_input, grad_weight, grad_bias)
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 7,
             "{}: expects (grad_loss, input, weight, bias?, target, log_sum_exp, logits), got {}", kBackward,
             metas_str(in));
  const auto [m, v] = check_operands(in.subspan(1, 4), a, kBackward);
  const TensorMeta &g = in[0], &lse = in[5], &logits = in[6];
  const DType dtype = in[1].dtype;
  KILN_CHECK(g.defined && g.dtype == dtype && g.shape.empty(),
             "{}: grad_loss must be a 0-d tensor of the input's dtype, got {}", kBackward, metas_str(in));
  KILN_CHECK(lse.defined && lse.dtype == DType::f64 && lse.shape == Shape{m} && logits.defined &&
                 logits.dtype == dtype && logits.shape == Shape({m, v}),
             "{}: log_sum_exp and logits must be the forward's (f64 [{}] and [{}, {}]), got {}", kBackward, m,
             m, v, metas_str(in));
  const Device d = common_device(in, kBackward);
  return {TensorMeta{in[1].shape, dtype, d}, TensorMeta{in[2].shape, dtype, d}, TensorMeta{{v}, dtype, d}};
}

const OpDef& kForwardOp =
    define_op({.name = kForward, .infer = infer_forward, .cast_policy = CastPolicy::f32});
const OpDef& kBackwardOp = define_op({.name = kBackward, .infer = infer_backward});

Attrs attrs_of(const LinearCrossEntropyOptions& o) {
  return {{"reduction", o.reduction}, {"ignore_index", o.ignore_index}};
}

}  // namespace

LinearCrossEntropyResult linear_cross_entropy_with_stats(const Tensor& input, const Tensor& weight,
                                                         const Tensor& bias, const Tensor& target,
                                                         const LinearCrossEntropyOptions& options) {
  std::vector<Tensor> out = call_op(kForwardOp, {input, weight, bias, target}, attrs_of(options));
  return {out[0], out[1], out[2], out[3]};
}

Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& target,
                            const LinearCrossEntropyOptions& options) {
  return linear_cross_entropy_with_stats(input, weight, bias, target, options).loss;
}

LinearCrossEntropyGrads linear_cross_entropy_backward(const Tensor& grad_loss, const Tensor& input,
                                                      const Tensor& weight, const Tensor& bias,
                                                      const Tensor& target, const Tensor& log_sum_exp,
                                                      const Tensor& logits,
                                                      const LinearCrossEntropyOptions& options) {
  std::vector<Tensor> out =
      call_op(kBackwardOp, {grad_loss, input, weight, bias, target, log_sum_exp, logits}, attrs_of(options));
  return {out[0], out[1], out[2]};
}

}  // namespace kiln
