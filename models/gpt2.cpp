// GPT-2 with Hugging Face's module tree, names and initialization (models/gpt2.h).
#include "models/gpt2.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/linalg.h"
#include "core/ops/loss.h"
#include "models/functional.h"
#include "models/init.h"
#include "models/token_inputs.h"

namespace kiln::models {

namespace {

GPT2Config sized(int64_t vocab_size, int64_t positions, int64_t layers, int64_t width,
                 int64_t heads) {
  return {.vocab_size = vocab_size,
          .n_positions = positions,
          .n_embd = width,
          .n_layer = layers,
          .n_head = heads};
}

const GPT2Config& checked(const GPT2Config& c) {
  KILN_CHECK(
      c.vocab_size > 0 && c.n_positions > 0 && c.n_embd > 0 && c.n_layer >= 0 && c.n_inner >= 0,
      "GPT-2: sizes must be positive (vocab_size {}, n_positions {}, n_embd {}, n_layer "
      "{}, n_inner {})",
      c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_inner);
  KILN_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0,
             "GPT-2: n_embd ({}) must be a positive multiple of n_head ({})", c.n_embd, c.n_head);
  return c;
}

int64_t inner(const GPT2Config& c) { return c.n_inner > 0 ? c.n_inner : 4 * c.n_embd; }

nn::LayerNorm layer_norm_of(const GPT2Config& c) {
  return nn::LayerNorm({c.n_embd}, {.eps = c.layer_norm_epsilon});
}

}  // namespace

GPT2Config GPT2Config::small(int64_t vocab_size) { return sized(vocab_size, 1024, 12, 768, 12); }
GPT2Config GPT2Config::tiny(int64_t vocab_size) { return sized(vocab_size, 512, 2, 128, 2); }
GPT2Config GPT2Config::mini(int64_t vocab_size) { return sized(vocab_size, 512, 4, 256, 4); }

// ---- Conv1D ----

Conv1D::Conv1D(int64_t in_features, int64_t out_features) {
  KILN_CHECK(in_features > 0 && out_features > 0,
             "Conv1D: sizes must be positive, got in_features={} out_features={}", in_features,
             out_features);
  // HF's own initialization: N(0, 0.02^2) weight, zero bias (GPT2Model redraws both).
  add_parameter("weight", nn::init::normal_(empty({in_features, out_features}), 0.0, 0.02));
  add_parameter("bias", zeros({out_features}));
}

Tensor Conv1D::forward(const Tensor& x) { return nn::functional::matmul_bias(x, weight(), bias()); }

std::string Conv1D::extra_repr() const {
  return fmt::format("nf={}, nx={}", weight().size(1), weight().size(0));
}

// ---- a block ----

GPT2Attention::GPT2Attention(const GPT2Config& c)
    : heads_(c.n_head),
      attn_pdrop_(c.attn_pdrop),
      c_attn_(add("c_attn", Conv1D(c.n_embd, 3 * c.n_embd))),
      c_proj_(add("c_proj", Conv1D(c.n_embd, c.n_embd))),
      resid_dropout_(add("resid_dropout", nn::Dropout(c.resid_pdrop))) {}

Tensor GPT2Attention::forward(const Tensor& x, const Tensor& keys) {
  const int64_t n = x.size(0), L = x.size(1), E = x.size(2);
  const Tensor qkv = c_attn_(x);
  // [N, L, E] slices -> [N, H, L, E / H]; the attention op reads the heads in place.
  auto heads = [&](int64_t i) {
    return qkv.slice(-1, i * E, (i + 1) * E).unflatten(-1, {heads_, E / heads_}).transpose(1, 2);
  };
  const Tensor out = scaled_dot_product_attention(
      heads(0), heads(1), heads(2),
      {.attn_mask = keys, .is_causal = true, .dropout_p = is_training() ? attn_pdrop_ : 0.0});
  return resid_dropout_(c_proj_(out.transpose(1, 2).reshape({n, L, E})));
}

GPT2Block::GPT2Block(const GPT2Config& c)
    : ln_1_(add("ln_1", layer_norm_of(c))),
      attn_(add("attn", GPT2Attention(c))),
      ln_2_(add("ln_2", layer_norm_of(c))),
      mlp_(add("mlp", nn::Module())),
      c_fc_(mlp_.add("c_fc", Conv1D(c.n_embd, inner(c)))),
      c_proj_(mlp_.add("c_proj", Conv1D(inner(c), c.n_embd))),
      mlp_dropout_(mlp_.add("dropout", nn::Dropout(c.resid_pdrop))) {}

Tensor GPT2Block::forward(const Tensor& x, const Tensor& keys) {
  const Tensor h = kiln::add(x, attn_.forward(ln_1_(x), keys));
  return kiln::add(h, mlp_dropout_(c_proj_(gelu(c_fc_(ln_2_(h)), "tanh"))));
}

// ---- the decoder ----

GPT2Model::GPT2Model(const GPT2Config& config)
    : config_(checked(config)),
      wte_(add("wte", nn::Embedding(config.vocab_size, config.n_embd))),
      wpe_(add("wpe", nn::Embedding(config.n_positions, config.n_embd))),
      drop_(add("drop", nn::Dropout(config.embd_pdrop))),
      h_(add("h", nn::ModuleList())),
      ln_f_(layer_norm_of(config)) {
  for (int64_t i = 0; i < config.n_layer; ++i) h_.push_back(GPT2Block(config));
  ln_f_ = add("ln_f", ln_f_);
  // HF's _init_weights: weights N(0, initializer_range^2), biases zero, and the projections
  // into the residual stream (c_proj) scaled down by sqrt(2 * n_layer), GPT-2's rule.
  const double std = config.initializer_range;
  nn::init::normal_(wte_.weight(), 0.0, std);
  nn::init::normal_(wpe_.weight(), 0.0, std);
  for (const auto& [name, p] : named_parameters()) {
    if (!name.starts_with("h.") || p.dim() != 2) continue;
    const bool residual = name.ends_with("c_proj.weight");
    nn::init::normal_(p, 0.0,
                      residual ? std / std::sqrt(2.0 * static_cast<double>(config.n_layer)) : std);
  }
}

Tensor GPT2Model::forward(const Tensor& input_ids, const Tensor& attention_mask,
                          const char* model) {
  check_input_ids(model, input_ids, config_.n_positions);
  check_per_token(model, "attention_mask", attention_mask, input_ids, true);
  const Tensor keys = key_padding_mask(attention_mask);
  const int64_t L = input_ids.size(1);
  // Positions 0..L-1 are wpe's first L rows: a slice, broadcast over the batch.
  Tensor x = drop_(
      kiln::add(embed_ids(model, "input_ids", wte_, input_ids), wpe_.weight().slice(0, 0, L)));
  for (int64_t i = 0; i < h_.size(); ++i) x = h_.at<GPT2Block>(i).forward(x, keys);
  return ln_f_(x);
}

GPT2LMHeadModel::GPT2LMHeadModel(const GPT2Config& config)
    : transformer_(add("transformer", GPT2Model(config))) {}

Tensor GPT2LMHeadModel::forward(const Tensor& input_ids, const Tensor& attention_mask) {
  const Tensor h = transformer_.forward(input_ids, attention_mask, "GPT2LMHeadModel");
  return matmul(h, transformer_.wte().weight().t());
}

void GPT2LMHeadModel::load_hf_state_dict(const StateDict& state) {
  bool prefixed = false;
  for (const auto& [name, t] : state) prefixed |= name.starts_with("transformer.");
  StateDict kept;
  for (const auto& [name, t] : state) {
    if (name == "lm_head.weight" || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    kept.emplace(prefixed ? name : "transformer." + name, t);
  }
  load_state_dict(kept);
}

Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels) {
  KILN_CHECK(logits.defined() && labels.defined() && logits.dim() == 3 &&
                 labels.dtype() == DType::i64 &&
                 labels.shape() == Shape({logits.size(0), logits.size(1)}) && logits.size(1) >= 2,
             "causal_lm_loss: logits must be [N, L, V] and labels i64 [N, L] with L >= 2, got {} "
             "and {}",
             logits.defined() ? logits.meta_str() : "undefined",
             labels.defined() ? labels.meta_str() : "undefined");
  // The targets move left instead of the logits: position i predicts labels[i + 1], and
  // the last position, which has nothing to predict, gets ignore_index. The same loss (the
  // mean over the same targets) without copying the [N, L - 1, V] logits, and the head and
  // loss stay one chain that the compiler fuses (compiler/passes/linear_cross_entropy.cpp).
  const int64_t L = logits.size(1), V = logits.size(2);
  const Tensor shifted = cat({labels.slice(1, 1, L), full({labels.size(0), 1}, int64_t{-100},
                                                           {.dtype = DType::i64, .device = labels.device()})},
                             1);
  return cross_entropy(logits.reshape({-1, V}), shifted.reshape({-1}), {.ignore_index = -100});
}

}  // namespace kiln::models
