// Matrix products: their shape and dtype rules and their public functions.
#include "core/ops/linalg.h"

#include "core/registry.h"

namespace kiln {
namespace {

// Dtype, device and definedness checks shared by every product. Errors show the operands
// as "f32[2,3] cpu @ f64[3,4] cpu".
void check_operands(const char* op, const TensorMeta& a, const TensorMeta& b) {
  KILN_CHECK(a.defined && b.defined, "{}: an operand is undefined", op);
  KILN_CHECK(a.dtype == b.dtype, "{}: {} @ {}: dtypes {} and {} differ", op, a.str(), b.str(),
             a.dtype, b.dtype);
  KILN_CHECK(a.dtype != DType::boolean, "{}: {} @ {}: bool operands are not supported", op, a.str(),
             b.str());
  KILN_CHECK(a.device == b.device, "{}: {} @ {}: devices {} and {} differ", op, a.str(), b.str(),
             a.device, b.device);
}

void check_inner(const char* op, const Shape& a, const Shape& b, int64_t ka, int64_t kb) {
  KILN_CHECK(ka == kb, "{}: {} @ {}: inner sizes {} and {} differ", op, shape_str(a), shape_str(b),
             ka, kb);
}

std::vector<TensorMeta> infer_matmul(std::span<const TensorMeta> in, const Attrs&) {
  KILN_CHECK(in.size() == 2, "matmul: expects 2 tensors, got {}", in.size());
  const TensorMeta &a = in[0], &b = in[1];
  check_operands("matmul", a, b);
  const size_t na = a.shape.size(), nb = b.shape.size();
  KILN_CHECK(na >= 1 && nb >= 1, "matmul: {} @ {}: a 0-d operand has no matrix dims",
             shape_str(a.shape), shape_str(b.shape));
  const int64_t ka = a.shape[na - 1], kb = b.shape[nb == 1 ? 0 : nb - 2];
  check_inner("matmul", a.shape, b.shape, ka, kb);
  const Shape batch_a(a.shape.begin(), a.shape.end() - std::min<size_t>(na, 2));
  const Shape batch_b(b.shape.begin(), b.shape.end() - std::min<size_t>(nb, 2));
  Shape out(std::max(batch_a.size(), batch_b.size()), 1);
  for (const Shape* s : {&batch_a, &batch_b}) {
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t& o = out[out.size() - s->size() + i];
      const int64_t v = (*s)[i];
      KILN_CHECK(o == 1 || v == 1 || o == v,
                 "matmul: {} @ {}: batch dims {} and {} do not broadcast", shape_str(a.shape),
                 shape_str(b.shape), shape_str(batch_a), shape_str(batch_b));
      if (v != 1) o = v;
    }
  }
  if (na >= 2) out.push_back(a.shape[na - 2]);
  if (nb >= 2) out.push_back(b.shape[nb - 1]);
  return {TensorMeta{out, a.dtype, a.device}};
}
const OpDef& kMatmul = define_op({.name = "matmul", .infer = infer_matmul, .cast_policy = CastPolicy::lower});

std::vector<TensorMeta> infer_mm(std::span<const TensorMeta> in, const Attrs&) {
  KILN_CHECK(in.size() == 2, "mm: expects 2 tensors, got {}", in.size());
  const TensorMeta &a = in[0], &b = in[1];
  check_operands("mm", a, b);
  KILN_CHECK(a.shape.size() == 2 && b.shape.size() == 2, "mm: {} @ {}: operands must be 2-d",
             shape_str(a.shape), shape_str(b.shape));
  check_inner("mm", a.shape, b.shape, a.shape[1], b.shape[0]);
  return {TensorMeta{{a.shape[0], b.shape[1]}, a.dtype, a.device}};
}
const OpDef& kMm = define_op({.name = "mm", .infer = infer_mm, .cast_policy = CastPolicy::lower});

std::vector<TensorMeta> infer_bmm(std::span<const TensorMeta> in, const Attrs&) {
  KILN_CHECK(in.size() == 2, "bmm: expects 2 tensors, got {}", in.size());
  const TensorMeta &a = in[0], &b = in[1];
  check_operands("bmm", a, b);
  KILN_CHECK(a.shape.size() == 3 && b.shape.size() == 3, "bmm: {} @ {}: operands must be 3-d",
             shape_str(a.shape), shape_str(b.shape));
  KILN_CHECK(a.shape[0] == b.shape[0], "bmm: {} @ {}: batch sizes {} and {} differ",
             shape_str(a.shape), shape_str(b.shape), a.shape[0], b.shape[0]);
  check_inner("bmm", a.shape, b.shape, a.shape[2], b.shape[1]);
  return {TensorMeta{{a.shape[0], a.shape[1], b.shape[2]}, a.dtype, a.device}};
}
const OpDef& kBmm = define_op({.name = "bmm", .infer = infer_bmm, .cast_policy = CastPolicy::lower});

// addmm(bias, a, b) with attributes beta and alpha (Scalars).
std::vector<TensorMeta> infer_addmm(std::span<const TensorMeta> in, const Attrs&) {
  KILN_CHECK(in.size() == 3, "addmm: expects 3 tensors (bias, a, b), got {}", in.size());
  const TensorMeta &bias = in[0], &a = in[1], &b = in[2];
  check_operands("addmm", a, b);
  KILN_CHECK(bias.defined, "addmm: the bias is undefined ({})", metas_str(in));
  KILN_CHECK(bias.dtype == a.dtype && bias.device == a.device,
             "addmm: bias {} does not match the operands' dtype and device ({})", bias.str(),
             metas_str(in));
  KILN_CHECK(a.shape.size() == 2 && b.shape.size() == 2, "addmm: {} @ {}: operands must be 2-d",
             shape_str(a.shape), shape_str(b.shape));
  check_inner("addmm", a.shape, b.shape, a.shape[1], b.shape[0]);
  const Shape out{a.shape[0], b.shape[1]};
  const Shape shapes[] = {bias.shape, out};
  KILN_CHECK(bias.shape.size() <= 2 && broadcast_shapes(shapes, "addmm") == out,
             "addmm: bias {} does not broadcast to the product's shape {} ({})",
             shape_str(bias.shape), shape_str(out), metas_str(in));
  return {TensorMeta{out, a.dtype, a.device}};
}
// A bias of the product's shape is read only at the element written.
int addmm_accumulator(std::span<const TensorMeta> in) {
  return in.size() == 3 && in[1].shape.size() == 2 && in[2].shape.size() == 2 &&
                 in[0].shape == Shape{in[1].shape[0], in[2].shape[1]}
             ? 0
             : -1;
}
const OpDef& kAddmm = define_op({.name = "addmm", .infer = infer_addmm, .accumulator = addmm_accumulator,
                                 .cast_policy = CastPolicy::lower});

// addmm_activation(bias [N], a [M, K], b [K, N]) {activation} -> (out, pre if gelu_tanh)
std::vector<TensorMeta> infer_addmm_activation(std::span<const TensorMeta> in, const Attrs& attrs) {
  const char* op = "addmm_activation";
  const std::string& act = attrs.str("activation");
  KILN_CHECK(act == "relu" || act == "gelu_tanh", "{}: activation must be \"relu\" or \"gelu_tanh\", got \"{}\"", op,
             act);
  KILN_CHECK(in.size() == 3, "{}: expects 3 tensors (bias, a, b), got {}", op, in.size());
  const TensorMeta &bias = in[0], &a = in[1], &b = in[2];
  check_operands(op, a, b);
  KILN_CHECK(is_floating(a.dtype), "{}: operands must be floating, got {}", op, metas_str(in));
  KILN_CHECK(a.shape.size() == 2 && b.shape.size() == 2, "{}: {} @ {}: operands must be 2-d", op,
             shape_str(a.shape), shape_str(b.shape));
  check_inner(op, a.shape, b.shape, a.shape[1], b.shape[0]);
  KILN_CHECK(bias.defined && bias.dtype == a.dtype && bias.device == a.device && bias.shape == Shape{b.shape[1]},
             "{}: bias must be [{}] of the operands' dtype and device, got {}", op, b.shape[1], metas_str(in));
  const TensorMeta out{{a.shape[0], b.shape[1]}, a.dtype, a.device};
  if (act == "relu") return {out};
  return {out, out};
}
const OpDef& kAddmmActivation = define_op({.name = "addmm_activation", .infer = infer_addmm_activation});

// mm_gelu_backward(g [M, K], w [K, N], pre [M, N]) -> (grad_pre [M, N], grad_bias [N])
std::vector<TensorMeta> infer_mm_gelu_backward(std::span<const TensorMeta> in, const Attrs&) {
  const char* op = "mm_gelu_backward";
  KILN_CHECK(in.size() == 3, "{}: expects 3 tensors (g, w, pre), got {}", op, in.size());
  const TensorMeta &g = in[0], &w = in[1], &pre = in[2];
  check_operands(op, g, w);
  KILN_CHECK(is_floating(g.dtype), "{}: operands must be floating, got {}", op, metas_str(in));
  KILN_CHECK(g.shape.size() == 2 && w.shape.size() == 2, "{}: {} @ {}: operands must be 2-d", op,
             shape_str(g.shape), shape_str(w.shape));
  check_inner(op, g.shape, w.shape, g.shape[1], w.shape[0]);
  const Shape out{g.shape[0], w.shape[1]};
  KILN_CHECK(pre.defined && pre.dtype == g.dtype && pre.device == g.device && pre.shape == out,
             "{}: pre must be the product's shape {} and the operands' dtype and device, got {}", op,
             shape_str(out), metas_str(in));
  return {TensorMeta{out, g.dtype, g.device}, TensorMeta{{out[1]}, g.dtype, g.device}};
}
const OpDef& kMmGeluBackward = define_op({.name = "mm_gelu_backward", .infer = infer_mm_gelu_backward});

}  // namespace

AddmmActivation addmm_activation(const Tensor& bias, const Tensor& a, const Tensor& b, const std::string& activation) {
  std::vector<Tensor> out = call_op(kAddmmActivation, {bias, a, b}, {{"activation", activation}});
  return {out[0], out.size() > 1 ? out[1] : Tensor()};
}

MmGeluBackward mm_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre) {
  std::vector<Tensor> out = call_op(kMmGeluBackward, {g, w, pre});
  return {out[0], out[1]};
}

Tensor matmul(const Tensor& a, const Tensor& b) { return call_op1(kMatmul, {a, b}); }
Tensor mm(const Tensor& a, const Tensor& b) { return call_op1(kMm, {a, b}); }
Tensor bmm(const Tensor& a, const Tensor& b) { return call_op1(kBmm, {a, b}); }
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  return call_op1(kAddmm, {bias, a, b}, {{"beta", beta}, {"alpha", alpha}});
}

}  // namespace kiln
