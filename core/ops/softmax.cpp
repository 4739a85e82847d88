// Softmax ops: their shape and dtype rules and their public functions.
#include "core/ops/softmax.h"

#include "core/registry.h"

namespace kiln {
namespace {

void check_floating(std::span<const TensorMeta> in, const char* op) {
  for (const TensorMeta& m : in)
    KILN_CHECK(is_floating(m.dtype),
               "{}: expects floating tensors, got {} (softmax and log_softmax take a dtype to "
               "convert integers)",
               op, metas_str(in));
}

template <const char* op>
std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 1 && in[0].defined, "{}: expects one tensor, got {}", op, metas_str(in));
  check_floating(in, op);
  wrap_dim(a.i("dim"), static_cast<int64_t>(in[0].shape.size()), op);
  return {in[0]};
}

// grad_out and out must agree in shape; the result takes their promoted floating dtype.
template <const char* op>
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 2 && in[0].defined && in[1].defined,
             "{}: expects (grad_out, out), got {}", op, metas_str(in));
  check_floating(in, op);
  KILN_CHECK(in[0].shape == in[1].shape, "{}: grad_out and out shapes differ ({})", op,
             metas_str(in));
  wrap_dim(a.i("dim"), static_cast<int64_t>(in[0].shape.size()), op);
  return {TensorMeta{in[0].shape, promote_types(in[0].dtype, in[1].dtype), common_device(in, op)}};
}

constexpr char kSoftmaxName[] = "softmax";
constexpr char kLogSoftmaxName[] = "log_softmax";
constexpr char kSoftmaxBackwardName[] = "softmax_backward";
constexpr char kLogSoftmaxBackwardName[] = "log_softmax_backward";

const OpDef& kSoftmax = define_op({.name = kSoftmaxName, .infer = infer_forward<kSoftmaxName>, .cast_policy = CastPolicy::f32});
const OpDef& kLogSoftmax =
    define_op({.name = kLogSoftmaxName, .infer = infer_forward<kLogSoftmaxName>, .cast_policy = CastPolicy::f32});
const OpDef& kSoftmaxBackward =
    define_op({.name = kSoftmaxBackwardName, .infer = infer_backward<kSoftmaxBackwardName>});
const OpDef& kLogSoftmaxBackward =
    define_op({.name = kLogSoftmaxBackwardName, .infer = infer_backward<kLogSoftmaxBackwardName>});

Tensor forward(const OpDef& op, const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  KILN_CHECK(x.defined(), "{}: the input is undefined", op.name);
  if (dtype) {
    KILN_CHECK(is_floating(*dtype), "{}: dtype must be floating, got {} (input {})", op.name,
               *dtype, x.meta_str());
    return call_op1(op, {x.to(*dtype)}, {{"dim", dim}});
  }
  return call_op1(op, {x}, {{"dim", dim}});
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return forward(kSoftmax, x, dim, dtype);
}
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return forward(kLogSoftmax, x, dim, dtype);
}
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return call_op1(kSoftmaxBackward, {grad_out, out}, {{"dim", dim}});
}
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return call_op1(kLogSoftmaxBackward, {grad_out, out}, {{"dim", dim}});
}

}  // namespace kiln
