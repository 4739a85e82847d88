// MultiheadAttention and TransformerEncoderLayer (models/attention.h).
#include "models/attention.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/ops/attention.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"
#include "models/functional.h"
#include "models/init.h"

namespace kiln::nn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A mask in MultiheadAttention's convention (bool true: not attended) as an additive float
// mask of `dtype`, or as scaled_dot_product_attention's bool mask (true: attended).
Tensor additive(const Tensor& mask, DType dtype) {
  return mask.dtype() == DType::boolean ? where(mask, -kInf, zeros({}, {.dtype = dtype}))
                                        : mask.to(dtype);
}

// key_padding_mask [N, S] and attn_mask [L, S] or [N * H, L, S] as one mask for the scores
// [N, H, L, S] in scaled_dot_product_attention's convention; undefined when neither is given.
Tensor merged_mask(const MultiheadAttentionCall& call, int64_t n, int64_t heads, int64_t L,
                   int64_t S, DType dtype) {
  Tensor padding, attn;
  if (call.key_padding_mask.defined()) {
    KILN_CHECK(call.key_padding_mask.shape() == Shape({n, S}),
               "MultiheadAttention: key_padding_mask must be [N, S] = [{}, {}], got {}", n, S,
               call.key_padding_mask.meta_str());
    padding = call.key_padding_mask.view({n, 1, 1, S});
  }
  if (call.attn_mask.defined()) {
    const Shape& s = call.attn_mask.shape();
    KILN_CHECK(s == Shape({L, S}) || s == Shape({n * heads, L, S}),
               "MultiheadAttention: attn_mask must be [L, S] = [{}, {}] or [N * num_heads, L, S] = "
               "[{}, {}, {}], got {}",
               L, S, n * heads, L, S, call.attn_mask.meta_str());
    attn = s.size() == 2 ? call.attn_mask : call.attn_mask.view({n, heads, L, S});
  }
  if (!padding.defined() && !attn.defined()) return {};
  const bool all_bool = (!padding.defined() || padding.dtype() == DType::boolean) &&
                        (!attn.defined() || attn.dtype() == DType::boolean);
  if (all_bool) {
    if (!padding.defined()) return logical_not(attn);
    if (!attn.defined()) return logical_not(padding);
    return logical_not(logical_or(padding, attn));
  }
  if (!padding.defined()) return additive(attn, dtype);
  if (!attn.defined()) return additive(padding, dtype);
  return add(additive(padding, dtype), additive(attn, dtype));
}

}  // namespace

// ---- MultiheadAttention ----

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                                       MultiheadAttentionOptions options)
    : embed_dim_(embed_dim),
      num_heads_(num_heads),
      options_(options),
      out_proj_(embed_dim > 0 ? embed_dim : 1, embed_dim > 0 ? embed_dim : 1,
                {.bias = options.bias}) {
  KILN_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0,
             "MultiheadAttention: embed_dim ({}) must be a positive multiple of num_heads ({})",
             embed_dim, num_heads);
  KILN_CHECK(options.dropout >= 0 && options.dropout <= 1,
             "MultiheadAttention: dropout must be in [0, 1], got {}", options.dropout);
  add_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  if (options.bias) add_parameter("in_proj_bias", empty({3 * embed_dim}));
  out_proj_ = add("out_proj", out_proj_);
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  init::xavier_uniform_(in_proj_weight());
  if (options_.bias) {
    init::zeros_(in_proj_bias());
    init::zeros_(out_proj_.bias());
  }
}

MultiheadAttentionResult MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                     const Tensor& value,
                                                     const MultiheadAttentionCall& call) {
  const int64_t E = embed_dim_, H = num_heads_, D = E / H;
  auto check = [&](const Tensor& t, const char* name) {
    KILN_CHECK(t.defined() && t.dim() == 3 && t.size(2) == E,
               "MultiheadAttention: {} must be [{}, E] with E = {}, got {}", name,
               options_.batch_first ? "N, L" : "L, N", E, t.defined() ? t.meta_str() : "undefined");
  };
  check(query, "query");
  check(key, "key");
  check(value, "value");
  // Everything below is batch first: [N, L, E].
  auto batch_first = [&](const Tensor& t) { return options_.batch_first ? t : t.transpose(0, 1); };
  const Tensor x_q = batch_first(query), x_k = batch_first(key), x_v = batch_first(value);
  const int64_t n = x_q.size(0), L = x_q.size(1), S = x_k.size(1);
  KILN_CHECK(x_k.size(0) == n && x_v.size(0) == n && x_v.size(1) == S,
             "MultiheadAttention: query {}, key {} and value {} disagree in batch or length",
             query.meta_str(), key.meta_str(), value.meta_str());

  const Tensor w = in_proj_weight(), b = in_proj_bias();
  auto part = [&](const Tensor& t, int64_t i) {
    return t.defined() ? t.slice(0, i * E, (i + 1) * E) : t;
  };
  Tensor q, k, v;
  if (query.same(key) && key.same(value)) {  // self-attention: one projection
    const Tensor qkv = functional::linear(x_q, w, b);
    q = qkv.slice(-1, 0, E);
    k = qkv.slice(-1, E, 2 * E);
    v = qkv.slice(-1, 2 * E, 3 * E);
  } else {
    q = functional::linear(x_q, part(w, 0), part(b, 0));
    k = functional::linear(x_k, part(w, 1), part(b, 1));
    v = functional::linear(x_v, part(w, 2), part(b, 2));
  }
  // [N, L, E] -> [N, H, L, D]: the attention op reads the heads in place.
  auto split = [&](const Tensor& t) { return t.unflatten(-1, {H, D}).transpose(1, 2); };
  q = split(q);
  k = split(k);
  v = split(v);

  const Tensor mask = merged_mask(call, n, H, L, S, q.dtype());
  const double p = is_training() ? options_.dropout : 0.0;
  MultiheadAttentionResult result;
  Tensor attended;  // [N, H, L, D]
  if (!call.need_weights) {
    attended = scaled_dot_product_attention(
        q, k, v, {.attn_mask = mask, .is_causal = call.is_causal, .dropout_p = p});
  } else {
    // The math path, which holds the probabilities it returns (after dropout, as PyTorch's).
    Tensor scores = mul(matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(D)));
    if (call.is_causal) {
      const Tensor rows = arange(L, {.device = q.device()}).unsqueeze(1);
      const Tensor cols = arange(S, {.device = q.device()}).unsqueeze(0);
      scores = where(ge(rows, cols), scores, -kInf);
    }
    if (mask.defined())
      scores =
          mask.dtype() == DType::boolean ? where(mask, scores, -kInf) : kiln::add(scores, mask);
    const Tensor probs = p > 0 ? dropout(softmax(scores, -1), p, true) : softmax(scores, -1);
    attended = matmul(probs, v);
    result.weights = call.average_attn_weights ? mean(probs, {1}) : probs;
  }
  // [N, H, L, D] -> [N, L, E], projected; back to [L, N, E] unless batch first.
  const Tensor merged = attended.transpose(1, 2).reshape({n, L, E});
  const Tensor out = out_proj_(merged);
  result.output = options_.batch_first ? out : out.transpose(0, 1);
  return result;
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x).output; }

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, dropout={}, batch_first={}", embed_dim_,
                     num_heads_, options_.dropout, options_.batch_first ? "True" : "False");
}

// ---- TransformerEncoderLayer ----

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                                                 TransformerEncoderLayerOptions options)
    : options_(options),
      self_attn_(add("self_attn", MultiheadAttention(d_model, nhead,
                                                     {.dropout = options.dropout,
                                                      .bias = options.bias,
                                                      .batch_first = options.batch_first}))),
      linear1_(add("linear1", Linear(d_model, options.dim_feedforward, {.bias = options.bias}))),
      dropout_(add("dropout", Dropout(options.dropout))),
      linear2_(add("linear2", Linear(options.dim_feedforward, d_model, {.bias = options.bias}))),
      norm1_(add("norm1",
                 LayerNorm({d_model}, {.eps = options.layer_norm_eps, .bias = options.bias}))),
      norm2_(add("norm2",
                 LayerNorm({d_model}, {.eps = options.layer_norm_eps, .bias = options.bias}))),
      dropout1_(add("dropout1", Dropout(options.dropout))),
      dropout2_(add("dropout2", Dropout(options.dropout))) {
  KILN_CHECK(options.activation == "relu" || options.activation == "gelu",
             "TransformerEncoderLayer: activation must be \"relu\" or \"gelu\", got \"{}\"",
             options.activation);
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask,
                                                     const Tensor& padding, bool is_causal) {
  const MultiheadAttentionResult r = self_attn_.forward(
      x, x, x, {.key_padding_mask = padding, .attn_mask = mask, .is_causal = is_causal});
  return dropout1_(r.output);
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  const Tensor h = linear1_(x);
  const Tensor a = options_.activation == "gelu" ? gelu(h) : relu(h);
  return dropout2_(linear2_(dropout_(a)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  if (options_.norm_first) {
    x = kiln::add(x, self_attention_block(norm1_(x), src_mask, src_key_padding_mask, is_causal));
    return kiln::add(x, feed_forward_block(norm2_(x)));
  }
  x = norm1_(kiln::add(x, self_attention_block(x, src_mask, src_key_padding_mask, is_causal)));
  return norm2_(kiln::add(x, feed_forward_block(x)));
}

}  // namespace kiln::nn
