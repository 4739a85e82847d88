// MultiheadAttention and TransformerEncoderLayer against references written head by head
// from ops (matmul, softmax), in f64, and their parameters against PyTorch's names.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "models/attention.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// nn.MultiheadAttention's computation for batch-first [N, L, E] inputs, one head at a time;
// `mask` [N, L, S] or undefined is added to every head's scores (bool: true masks out).
// Returns the output and the head-averaged probabilities.
std::pair<Tensor, Tensor> reference_mha(nn::MultiheadAttention& m, const Tensor& q_in,
                                        const Tensor& k_in, const Tensor& v_in,
                                        const Tensor& mask) {
  const int64_t E = m.embed_dim(), H = m.num_heads(), D = E / H;
  const Tensor w = m.in_proj_weight(), b = m.in_proj_bias();
  std::vector<Tensor> heads;
  Tensor weights;
  for (int64_t h = 0; h < H; ++h) {
    auto proj = [&](const Tensor& x, int64_t which) {
      const int64_t r = which * E + h * D;
      return add(matmul(x, w.slice(0, r, r + D).t()), b.slice(0, r, r + D));
    };
    const Tensor q = proj(q_in, 0), k = proj(k_in, 1), v = proj(v_in, 2);
    Tensor scores = div(matmul(q, k.transpose(1, 2)), std::sqrt(static_cast<double>(D)));
    if (mask.defined())
      scores = mask.dtype() == DType::boolean ? where(mask, -kInf, scores) : add(scores, mask);
    const Tensor p = softmax(scores, -1);
    weights = weights.defined() ? add(weights, p) : p;
    heads.push_back(matmul(p, v));
  }
  const Tensor out = add(matmul(cat(heads, -1), m.out_proj().weight().t()), m.out_proj().bias());
  return {out, div(weights, static_cast<double>(H))};
}

nn::MultiheadAttention f64_mha(int64_t E, int64_t H, bool batch_first) {
  manual_seed(3);
  nn::MultiheadAttention m(E, H, {.batch_first = batch_first});
  m.to(DType::f64);
  NoGradGuard no_grad;
  // Non-zero biases, so that a bias in the wrong place shows.
  m.in_proj_bias().copy_(randn({3 * E}, {.dtype = DType::f64}));
  m.out_proj().bias().copy_(randn({E}, {.dtype = DType::f64}));
  return m;
}

}  // namespace

TEST_CASE("MultiheadAttention has PyTorch's parameters", "[attention][layers]") {
  nn::MultiheadAttention m(12, 3);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : m.named_parameters()) shapes[name] = t.shape();
  CHECK(shapes == std::map<std::string, Shape>{{"in_proj_weight", {36, 12}},
                                               {"in_proj_bias", {36}},
                                               {"out_proj.weight", {12, 12}},
                                               {"out_proj.bias", {12}}});
  CHECK(values(m.in_proj_bias()) == std::vector<double>(36, 0.0));
  // xavier_uniform_: |w| <= sqrt(6 / (fan_in + fan_out)) = sqrt(6 / 48)
  CHECK(amax(abs(m.in_proj_weight())).item<double>() <= std::sqrt(6.0 / 48));
  CHECK_THROWS_WITH(nn::MultiheadAttention(10, 3),
                    Catch::Matchers::Contains("multiple of num_heads"));
}

TEST_CASE("MultiheadAttention matches a head-by-head reference", "[attention][layers]") {
  const bool batch_first = GENERATE(true, false);
  const bool self = GENERATE(true, false);
  const int mask_kind = GENERATE(0, 1, 2);  // none; key padding and bool attn_mask; float attn_mask
  CAPTURE(batch_first, self, mask_kind);
  nn::MultiheadAttention m = f64_mha(12, 3, batch_first);
  const int64_t n = 2, L = 5, S = self ? 5 : 7;
  Generator gen(4);
  const Tensor x = randn({n, L, 12}, {.dtype = DType::f64}, &gen);
  const Tensor kv = self ? x : randn({n, S, 12}, {.dtype = DType::f64}, &gen);
  const Tensor vv = self ? x : randn({n, S, 12}, {.dtype = DType::f64}, &gen);
  nn::MultiheadAttentionCall call;
  Tensor ref_mask;
  if (mask_kind == 1) {
    std::vector<double> pad(static_cast<size_t>(n * S), 0.0);
    pad[static_cast<size_t>(S - 1)] = 1;  // sequence 0's last key is padding
    pad[static_cast<size_t>(2 * S - 2)] = 1;
    call.key_padding_mask = tensor_of(pad, {n, S}, DType::boolean);
    call.attn_mask = gt(rand({L, S}, {}, &gen), 0.8);  // true: not attended
    ref_mask = logical_or(call.key_padding_mask.unsqueeze(1), call.attn_mask.unsqueeze(0));
  } else if (mask_kind == 2) {
    call.attn_mask = randn({L, S}, {.dtype = DType::f64}, &gen);
    ref_mask = call.attn_mask.unsqueeze(0).expand({n, L, S});
  }
  auto seq_first = [&](const Tensor& t) {
    return batch_first ? t : t.transpose(0, 1).contiguous();
  };
  const Tensor query = seq_first(x);
  const Tensor key = self ? query : seq_first(kv);
  const Tensor value = self ? query : seq_first(vv);
  const auto [want, want_weights] = reference_mha(m, x, kv, vv, ref_mask);

  const nn::MultiheadAttentionResult fused = m.forward(query, key, value, call);
  CHECK_FALSE(fused.weights.defined());
  KILN_CHECK_CLOSE(fused.output, seq_first(want), 0, 1e-12);
  call.need_weights = true;
  const nn::MultiheadAttentionResult math = m.forward(query, key, value, call);
  KILN_CHECK_CLOSE(math.output, seq_first(want), 0, 1e-12);
  KILN_CHECK_CLOSE(math.weights, want_weights, 0, 1e-12);
  call.average_attn_weights = false;
  CHECK(m.forward(query, key, value, call).weights.shape() == Shape{n, 3, L, S});

  // The gradients of every parameter, through the attention op's backward.
  Tensor g = randn(fused.output.shape(), {.dtype = DType::f64}, &gen);
  sum(mul(fused.output, g)).backward();
  std::map<std::string, Tensor> got;
  for (const auto& [name, t] : m.named_parameters()) got[name] = t.grad();
  m.zero_grad();
  sum(mul(seq_first(want), g)).backward();
  for (const auto& [name, t] : m.named_parameters()) {
    INFO(name);
    KILN_CHECK_CLOSE(got[name], t.grad(), 0, 1e-11);
  }
}

TEST_CASE("MultiheadAttention's bad inputs are errors naming it", "[attention][layers]") {
  nn::MultiheadAttention m(8, 2, {.batch_first = true});
  const Tensor x = randn({2, 5, 8});
  CHECK_THROWS_WITH(m.forward(randn({2, 5, 6})),
                    Catch::Matchers::Contains("MultiheadAttention: query") &&
                        Catch::Matchers::Contains("f32[2,5,6]"));
  CHECK_THROWS_WITH(
      m.forward(x, x, x, {.key_padding_mask = ones({2, 4}, {.dtype = DType::boolean})}),
      Catch::Matchers::Contains("key_padding_mask must be [N, S] = [2, 5]"));
  CHECK_THROWS_WITH(m.forward(x, x, x, {.attn_mask = ones({4, 5})}),
                    Catch::Matchers::Contains("attn_mask must be [L, S] = [5, 5]"));
}

TEST_CASE("TransformerEncoderLayer matches its composition from ops", "[attention][layers]") {
  const bool norm_first = GENERATE(false, true);
  const std::string activation = GENERATE("relu", "gelu");
  CAPTURE(norm_first, activation);
  manual_seed(5);
  nn::TransformerEncoderLayer layer(16, 4,
                                    {.dim_feedforward = 24,
                                     .dropout = 0.0,
                                     .activation = activation,
                                     .batch_first = true,
                                     .norm_first = norm_first});
  layer.to(DType::f64);
  std::set<std::string> names;
  for (const auto& [name, t] : layer.named_parameters()) names.insert(name);
  CHECK(names == std::set<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                       "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                       "linear1.weight", "linear1.bias", "linear2.weight",
                                       "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight",
                                       "norm2.bias"});
  Generator gen(6);
  const Tensor x = randn({3, 9, 16}, {.dtype = DType::f64}, &gen);
  const Tensor padding = lt(rand({3, 9}, {}, &gen), 0.2);

  nn::MultiheadAttention attn = layer.self_attn();
  auto* linear1 = dynamic_cast<nn::Linear*>(layer.child("linear1"));
  auto* linear2 = dynamic_cast<nn::Linear*>(layer.child("linear2"));
  auto* norm1 = dynamic_cast<nn::LayerNorm*>(layer.child("norm1"));
  auto* norm2 = dynamic_cast<nn::LayerNorm*>(layer.child("norm2"));
  REQUIRE((linear1 && linear2 && norm1 && norm2));
  auto ln = [](nn::LayerNorm* n, const Tensor& t) {
    return layer_norm(t, {16}, n->weight(), n->bias(), 1e-5);
  };
  auto sa = [&](const Tensor& t) {
    return reference_mha(attn, t, t, t, padding.unsqueeze(1).expand({3, 9, 9})).first;
  };
  auto ff = [&](const Tensor& t) {
    const Tensor h = add(matmul(t, linear1->weight().t()), linear1->bias());
    const Tensor a = activation == "gelu" ? gelu(h) : relu(h);
    return add(matmul(a, linear2->weight().t()), linear2->bias());
  };
  Tensor want;
  if (norm_first) {
    const Tensor h = add(x, sa(ln(norm1, x)));
    want = add(h, ff(ln(norm2, h)));
  } else {
    const Tensor h = ln(norm1, add(x, sa(x)));
    want = ln(norm2, add(h, ff(h)));
  }
  KILN_CHECK_CLOSE(layer.forward(x, {}, padding), want, 0, 1e-12);
  // Eval mode with dropout: the same function.
  manual_seed(5);
  nn::TransformerEncoderLayer dropped(16, 4,
                                      {.dim_feedforward = 24,
                                       .dropout = 0.3,
                                       .activation = activation,
                                       .batch_first = true,
                                       .norm_first = norm_first});
  dropped.to(DType::f64);
  dropped.eval();
  KILN_CHECK_CLOSE(dropped.forward(x, {}, padding), want, 0, 1e-12);
  dropped.train();
  CHECK_FALSE(allclose(dropped.forward(x, {}, padding), want, 0, 1e-6));
}

TEST_CASE(
    "MultiheadAttention's dropout: the fused and the weights paths drop the same probabilities",
    "[attention][layers]") {
  manual_seed(8);
  nn::MultiheadAttention m(8, 2, {.dropout = 0.4, .batch_first = true});
  m.to(DType::f64);
  Generator gen(9);
  const Tensor x = randn({2, 6, 8}, {.dtype = DType::f64}, &gen);
  manual_seed(10);
  const Tensor fused = m.forward(x, x, x).output;
  manual_seed(10);
  const nn::MultiheadAttentionResult math =
      m.forward(x, x, x, {.need_weights = true, .average_attn_weights = false});
  KILN_CHECK_CLOSE(fused, math.output, 0, 1e-12);
  // The weights are after dropout, as PyTorch returns them: kept ones scaled by 1 / (1 - p).
  const std::vector<double> w = values(math.weights);
  CHECK(std::count(w.begin(), w.end(), 0.0) > 0);
  m.eval();
  const nn::MultiheadAttentionResult eval = m.forward(x, x, x, {.need_weights = true});
  KILN_CHECK_CLOSE(sum(eval.weights, {-1}), ones({2, 6}, {.dtype = DType::f64}), 0, 1e-12);
}
