// Scaled dot-product attention: the rules of the forward and backward ops, their public
// functions and the math path kept as the reference.
#include "core/ops/attention.h"

#include <cmath>
#include <limits>

#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"
#include "core/registry.h"

namespace kiln {
namespace {

constexpr const char* kForwardName = "scaled_dot_product_attention";
constexpr const char* kBackwardName = "scaled_dot_product_attention_backward";

Shape leading(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

// Checks q, k, v (and the mask) against each other; returns the scores' shape [..., L, S].
Shape check_qkv(const TensorMeta& q, const TensorMeta& k, const TensorMeta& v,
                const TensorMeta* mask, std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(is_floating(q.dtype) && q.dtype == k.dtype && q.dtype == v.dtype,
             "{}: q, k and v must be floating tensors of one dtype, got {}", op, metas_str(in));
  KILN_CHECK(
      q.shape.size() >= 2 && k.shape.size() == q.shape.size() && v.shape.size() == q.shape.size(),
      "{}: q [..., L, E], k [..., S, E] and v [..., S, Ev] must have the same rank (at least "
      "2), got {}",
      op, metas_str(in));
  KILN_CHECK(leading(q.shape) == leading(k.shape) && leading(q.shape) == leading(v.shape),
             "{}: q, k and v must have the same leading (batch) dims, got {}", op, metas_str(in));
  const size_t r = q.shape.size();
  KILN_CHECK(k.shape[r - 1] == q.shape[r - 1],
             "{}: q's and k's last dims (the embedding E) differ: {}", op, metas_str(in));
  KILN_CHECK(v.shape[r - 2] == k.shape[r - 2],
             "{}: k and v must have the same number of keys S, got {}", op, metas_str(in));
  Shape scores = leading(q.shape);
  scores.push_back(q.shape[r - 2]);
  scores.push_back(k.shape[r - 2]);
  if (mask && mask->defined) {
    KILN_CHECK(mask->dtype == DType::boolean || is_floating(mask->dtype),
               "{}: attn_mask must be bool or floating, got {}", op, metas_str(in));
    bool fits = mask->shape.size() <= scores.size();
    for (size_t i = 0; fits && i < mask->shape.size(); ++i) {
      const int64_t m = mask->shape[mask->shape.size() - 1 - i];
      fits = m == 1 || m == scores[scores.size() - 1 - i];
    }
    KILN_CHECK(fits, "{}: attn_mask {} does not broadcast to the scores' shape {} ({})", op,
               shape_str(mask->shape), shape_str(scores), metas_str(in));
  }
  return scores;
}

void check_probability(double p, const char* op) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "{}: dropout_p must be in [0, 1], got {}", op, p);
}

DType stats_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 4 && in[0].defined && in[1].defined && in[2].defined,
             "{}: expects (q, k, v, attn_mask?), got {}", kForwardName, metas_str(in));
  check_qkv(in[0], in[1], in[2], &in[3], in, kForwardName);
  check_probability(a.f("dropout_p"), kForwardName);
  const Device device = common_device(in, kForwardName);
  Shape out = in[0].shape, lse = leading(in[0].shape);
  out.back() = in[2].shape.back();
  lse.push_back(in[0].shape[in[0].shape.size() - 2]);
  return {TensorMeta{out, in[0].dtype, device}, TensorMeta{lse, stats_dtype(in[0].dtype), device},
          TensorMeta{{2}, DType::i64, device}};
}

// (grad_out, q, k, v, attn_mask?, out, logsumexp, rng_state) -> (grad_q, grad_k, grad_v).
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 8 && in[0].defined && in[1].defined && in[2].defined && in[3].defined &&
                 in[5].defined && in[6].defined && in[7].defined,
             "{}: expects (grad_out, q, k, v, attn_mask?, out, logsumexp, rng_state), got {}",
             kBackwardName, metas_str(in));
  const TensorMeta &q = in[1], &k = in[2], &v = in[3];
  check_qkv(q, k, v, &in[4], in, kBackwardName);
  check_probability(a.f("dropout_p"), kBackwardName);
  Shape out = q.shape, lse = leading(q.shape);
  out.back() = v.shape.back();
  lse.push_back(q.shape[q.shape.size() - 2]);
  KILN_CHECK(
      in[0].shape == out && in[5].shape == out && in[0].dtype == q.dtype && in[5].dtype == q.dtype,
      "{}: grad_out and out must be {}{} like the forward's output, got {}", kBackwardName, q.dtype,
      shape_str(out), metas_str(in));
  KILN_CHECK(in[6].shape == lse && in[6].dtype == stats_dtype(q.dtype),
             "{}: logsumexp must be {}{}, got {}", kBackwardName, stats_dtype(q.dtype),
             shape_str(lse), metas_str(in));
  KILN_CHECK(in[7].shape == Shape{2} && in[7].dtype == DType::i64,
             "{}: rng_state must be i64[2], got {}", kBackwardName, metas_str(in));
  const Device device = common_device(in, kBackwardName);
  return {TensorMeta{q.shape, q.dtype, device}, TensorMeta{k.shape, k.dtype, device},
          TensorMeta{v.shape, v.dtype, device}};
}

// Autocast runs attention in the lower dtype, as PyTorch does.
const OpDef& kForward = define_op({.name = kForwardName,
                                   .infer = infer_forward,
                                   .random = true,
                                   .cast_policy = CastPolicy::lower});
const OpDef& kBackward = define_op({.name = kBackwardName, .infer = infer_backward});

Attrs attention_attrs(bool is_causal, double dropout_p, double scale) {
  return {{"is_causal", is_causal}, {"dropout_p", dropout_p}, {"scale", scale}};
}

}  // namespace

double attention_scale(const Tensor& q, const AttentionOptions& options) {
  if (options.scale) return *options.scale;
  KILN_CHECK(q.defined() && q.dim() >= 1, "{}: q must have an embedding dim, got {}", kForwardName,
             q.defined() ? q.meta_str() : "an undefined tensor");
  return 1.0 / std::sqrt(static_cast<double>(q.shape().back()));
}

AttentionResult scaled_dot_product_attention_with_stats(const Tensor& q, const Tensor& k,
                                                        const Tensor& v,
                                                        const AttentionOptions& options) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined",
             kForwardName);
  check_probability(options.dropout_p, kForwardName);
  // The counters are reserved for the probabilities [..., L, S] only when dropout draws.
  uint64_t counters = 0;
  if (options.dropout_p > 0 && q.dim() >= 2 && k.dim() >= 2)
    counters = static_cast<uint64_t>(numel_of(leading(q.shape())) * q.shape()[q.dim() - 2] *
                                     k.shape()[k.dim() - 2]);
  Generator& gen = options.generator ? *options.generator : default_generator();
  const Generator::Reservation r = gen.reserve(counters);
  Attrs attrs = attention_attrs(options.is_causal, options.dropout_p, attention_scale(q, options));
  attrs.set("seed", static_cast<int64_t>(r.seed));
  attrs.set("offset", static_cast<int64_t>(r.offset));
  std::vector<Tensor> out = call_op(kForward, {q, k, v, options.attn_mask}, attrs);
  return {out[0], out[1], out[2]};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  return scaled_dot_product_attention_with_stats(q, k, v, options).out;
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                     const Tensor& k, const Tensor& v,
                                                     const Tensor& attn_mask, const Tensor& out,
                                                     const Tensor& logsumexp,
                                                     const Tensor& rng_state, bool is_causal,
                                                     double dropout_p, double scale) {
  std::vector<Tensor> g =
      call_op(kBackward, {grad_out, q, k, v, attn_mask, out, logsumexp, rng_state},
              attention_attrs(is_causal, dropout_p, scale));
  return {g[0], g[1], g[2]};
}

Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOptions& options) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined",
             kForwardName);
  const TensorMeta metas[] = {TensorMeta::of(q), TensorMeta::of(k), TensorMeta::of(v),
                              options.attn_mask.defined() ? TensorMeta::of(options.attn_mask)
                                                          : TensorMeta{.defined = false}};
  check_qkv(metas[0], metas[1], metas[2], &metas[3], metas, kForwardName);
  check_probability(options.dropout_p, kForwardName);
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), attention_scale(q, options));
  if (options.is_causal) {
    const int64_t L = q.shape()[q.dim() - 2], S = k.shape()[k.dim() - 2];
    const Tensor rows = arange(L, {.device = q.device()}).unsqueeze(1);
    const Tensor cols = arange(S, {.device = q.device()}).unsqueeze(0);
    scores = where(ge(rows, cols), scores, -inf);
  }
  if (options.attn_mask.defined()) {
    scores = options.attn_mask.dtype() == DType::boolean
                 ? where(options.attn_mask, scores, -inf)
                 : add(scores, options.attn_mask.to(scores.dtype()));
  }
  // A row with every key masked is all -inf: softmax makes it NaN, attention zeros.
  const Tensor empty_row = eq(amax(scores, {-1}, true), -inf);
  Tensor probs = where(empty_row, 0.0, softmax(scores, -1));
  if (options.dropout_p > 0) probs = dropout(probs, options.dropout_p, true, options.generator);
  return matmul(probs, v);
}

}  // namespace kiln
