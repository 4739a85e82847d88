// Loss ops: their shape and dtype rules and their public functions.
#include "core/ops/loss.h"

#include "core/ops/softmax.h"
#include "core/registry.h"

namespace kiln {
namespace {

void check_reduction(const Attrs& a, const char* op) {
  const std::string& r = a.str("reduction");
  KILN_CHECK(r == "none" || r == "mean" || r == "sum",
             "{}: reduction must be \"none\", \"mean\" or \"sum\", got \"{}\"", op, r);
}

Shape reduced_shape(const Attrs& a, Shape unreduced) {
  return a.str("reduction") == "none" ? unreduced : Shape{};
}

// The input without its class dim (dim 1, or dim 0 of a [C] input).
Shape without_class_dim(const Shape& s) {
  if (s.size() <= 1) return {};
  Shape r = s;
  r.erase(r.begin() + 1);
  return r;
}

void check_label_smoothing(const Attrs& a, const char* op) {
  if (!a.has("label_smoothing")) return;
  const double ls = a.f("label_smoothing");
  KILN_CHECK(ls >= 0.0 && ls <= 1.0, "{}: label_smoothing must be in [0, 1], got {}", op, ls);
}

void check_weight(std::span<const TensorMeta> in, const TensorMeta& w, int64_t classes,
                  const char* op) {
  if (!w.defined) return;
  KILN_CHECK(is_floating(w.dtype) && w.shape == Shape{classes},
             "{}: weight must be a floating tensor of shape [{}] (one per class), got {}", op,
             classes, metas_str(in));
}

// (log_probs, target, weight?) with class-index targets.
TensorMeta infer_class_index(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 3 && in[0].defined && in[1].defined,
             "{}: expects (log_probs, target, weight?), got {}", op, metas_str(in));
  check_reduction(a, op);
  check_label_smoothing(a, op);
  a.i("ignore_index");
  const TensorMeta &x = in[0], &t = in[1];
  KILN_CHECK(is_floating(x.dtype) && !x.shape.empty(),
             "{}: input must be a floating tensor of 1 or more dims, got {}", op, metas_str(in));
  KILN_CHECK(t.dtype == DType::i64, "{}: target must be i64 class indices, got {}", op,
             metas_str(in));
  const Shape expected = without_class_dim(x.shape);
  KILN_CHECK(t.shape == expected, "{}: target shape {} does not match input {} (expected {})", op,
             shape_str(t.shape), shape_str(x.shape), shape_str(expected));
  const int64_t classes = x.shape.size() == 1 ? x.shape[0] : x.shape[1];
  check_weight(in, in[2], classes, op);
  return TensorMeta{reduced_shape(a, expected), x.dtype, common_device(in, op)};
}

// (log_probs, target_probs, weight?) with a target shaped like the input.
TensorMeta infer_class_probs(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 3 && in[0].defined && in[1].defined,
             "{}: expects (log_probs, target_probs, weight?), got {}", op, metas_str(in));
  check_reduction(a, op);
  check_label_smoothing(a, op);
  const TensorMeta &x = in[0], &t = in[1];
  KILN_CHECK(is_floating(x.dtype) && !x.shape.empty() && is_floating(t.dtype),
             "{}: input and target must be floating tensors of 1 or more dims, got {}", op,
             metas_str(in));
  KILN_CHECK(t.shape == x.shape, "{}: target shape {} does not match input {}", op,
             shape_str(t.shape), shape_str(x.shape));
  const int64_t classes = x.shape.size() == 1 ? x.shape[0] : x.shape[1];
  check_weight(in, in[2], classes, op);
  return TensorMeta{reduced_shape(a, without_class_dim(x.shape)), x.dtype, common_device(in, op)};
}

TensorMeta infer_mse_meta(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 2 && in[0].defined && in[1].defined,
             "{}: expects (input, target), got {}", op, metas_str(in));
  check_reduction(a, op);
  const DType t = result_type(in);
  KILN_CHECK(is_floating(t), "{}: expects floating tensors, got {}", op, metas_str(in));
  const Shape shapes[] = {in[0].shape, in[1].shape};
  return TensorMeta{broadcast_shapes(shapes, op), t, common_device(in, op)};
}

// A backward op's inputs are (grad_out, the forward op's inputs...): grad_out must be shaped
// like the forward result; the gradient is shaped like `grad_meta`.
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const TensorMeta& loss,
                                       TensorMeta grad_meta, const char* op) {
  const TensorMeta& g = in[0];
  KILN_CHECK(g.defined && is_floating(g.dtype) && g.shape == loss.shape,
             "{}: grad_out must be a floating tensor of shape {}, got {}", op,
             shape_str(loss.shape), metas_str(in));
  grad_meta.device = common_device(in, op);
  return {grad_meta};
}

template <const char* op>
std::vector<TensorMeta> infer_class_index_loss(std::span<const TensorMeta> in, const Attrs& a) {
  return {infer_class_index(in, a, op)};
}
template <const char* op>
std::vector<TensorMeta> infer_class_index_backward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 4, "{}: expects (grad_out, log_probs, target, weight?), got {}", op,
             metas_str(in));
  return infer_backward(in, infer_class_index(in.subspan(1), a, op), in[1], op);
}

constexpr char kNllLossName[] = "nll_loss";
constexpr char kCrossEntropyLossName[] = "cross_entropy_loss";
constexpr char kNllLossBackwardName[] = "nll_loss_backward";
constexpr char kCrossEntropyLossBackwardName[] = "cross_entropy_loss_backward";

std::vector<TensorMeta> infer_prob_loss(std::span<const TensorMeta> in, const Attrs& a) {
  return {infer_class_probs(in, a, "cross_entropy_prob_loss")};
}
std::vector<TensorMeta> infer_prob_loss_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "cross_entropy_prob_loss_backward";
  KILN_CHECK(in.size() == 4, "{}: expects (grad_out, log_probs, target_probs, weight?), got {}", op,
             metas_str(in));
  return infer_backward(in, infer_class_probs(in.subspan(1), a, op), in[1], op);
}
std::vector<TensorMeta> infer_mse(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = infer_mse_meta(in, a, "mse_loss");
  m.shape = reduced_shape(a, m.shape);
  return {m};
}
std::vector<TensorMeta> infer_mse_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "mse_loss_backward";
  KILN_CHECK(in.size() == 3, "{}: expects (grad_out, input, target), got {}", op, metas_str(in));
  const TensorMeta grad = infer_mse_meta(in.subspan(1), a, op);
  TensorMeta loss = grad;
  loss.shape = reduced_shape(a, grad.shape);
  return infer_backward(in, loss, grad, op);
}

const OpDef& kNllLoss =
    define_op({.name = kNllLossName, .infer = infer_class_index_loss<kNllLossName>, .cast_policy = CastPolicy::f32});
const OpDef& kCrossEntropyLoss = define_op(
    {.name = kCrossEntropyLossName, .infer = infer_class_index_loss<kCrossEntropyLossName>, .cast_policy = CastPolicy::f32});
const OpDef& kCrossEntropyProbLoss =
    define_op({.name = "cross_entropy_prob_loss", .infer = infer_prob_loss, .cast_policy = CastPolicy::f32});
const OpDef& kMseLoss = define_op({.name = "mse_loss", .infer = infer_mse, .cast_policy = CastPolicy::f32});
const OpDef& kNllLossBackward = define_op(
    {.name = kNllLossBackwardName, .infer = infer_class_index_backward<kNllLossBackwardName>});
const OpDef& kCrossEntropyLossBackward =
    define_op({.name = kCrossEntropyLossBackwardName,
               .infer = infer_class_index_backward<kCrossEntropyLossBackwardName>});
const OpDef& kCrossEntropyProbLossBackward =
    define_op({.name = "cross_entropy_prob_loss_backward", .infer = infer_prob_loss_backward});
const OpDef& kMseLossBackward =
    define_op({.name = "mse_loss_backward", .infer = infer_mse_backward});

Attrs nll_attrs(const NllLossOptions& o) {
  return {{"reduction", o.reduction}, {"ignore_index", o.ignore_index}};
}
Attrs cross_entropy_attrs(const CrossEntropyOptions& o) {
  return {{"reduction", o.reduction},
          {"ignore_index", o.ignore_index},
          {"label_smoothing", o.label_smoothing}};
}
Attrs prob_attrs(const CrossEntropyOptions& o) {
  return {{"reduction", o.reduction}, {"label_smoothing", o.label_smoothing}};
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options) {
  return call_op1(kNllLoss, {log_probs, target, options.weight}, nll_attrs(options));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options) {
  KILN_CHECK(logits.defined() && target.defined(), "cross_entropy: an input is undefined");
  KILN_CHECK(logits.dim() >= 1 && is_floating(logits.dtype()),
             "cross_entropy: logits must be a floating tensor of 1 or more dims, got {}",
             logits.meta_str());
  const Tensor log_probs = log_softmax(logits, logits.dim() == 1 ? 0 : 1);
  if (is_floating(target.dtype())) return cross_entropy_prob_loss(log_probs, target, options);
  if (options.label_smoothing == 0.0)
    return nll_loss(log_probs, target,
                    {.weight = options.weight,
                     .ignore_index = options.ignore_index,
                     .reduction = options.reduction});
  return cross_entropy_loss(log_probs, target, options);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  return call_op1(kMseLoss, {input, target}, {{"reduction", reduction}});
}

Tensor cross_entropy_loss(const Tensor& log_probs, const Tensor& target,
                          const CrossEntropyOptions& options) {
  return call_op1(kCrossEntropyLoss, {log_probs, target, options.weight},
                  cross_entropy_attrs(options));
}

Tensor cross_entropy_prob_loss(const Tensor& log_probs, const Tensor& target_probs,
                               const CrossEntropyOptions& options) {
  return call_op1(kCrossEntropyProbLoss, {log_probs, target_probs, options.weight},
                  prob_attrs(options));
}

Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target,
                         const NllLossOptions& options) {
  return call_op1(kNllLossBackward, {grad_out, log_probs, target, options.weight},
                  nll_attrs(options));
}

Tensor cross_entropy_loss_backward(const Tensor& grad_out, const Tensor& log_probs,
                                   const Tensor& target, const CrossEntropyOptions& options) {
  return call_op1(kCrossEntropyLossBackward, {grad_out, log_probs, target, options.weight},
                  cross_entropy_attrs(options));
}

Tensor cross_entropy_prob_loss_backward(const Tensor& grad_out, const Tensor& log_probs,
                                        const Tensor& target_probs,
                                        const CrossEntropyOptions& options) {
  return call_op1(kCrossEntropyProbLossBackward,
                  {grad_out, log_probs, target_probs, options.weight}, prob_attrs(options));
}

Tensor mse_loss_backward(const Tensor& grad_out, const Tensor& input, const Tensor& target,
                         const std::string& reduction) {
  return call_op1(kMseLossBackward, {grad_out, input, target}, {{"reduction", reduction}});
}

}  // namespace kiln
