#pragma once
// Attention layers with PyTorch's parameter layout and semantics: nn::MultiheadAttention
// (torch.nn.MultiheadAttention for equal query, key and value sizes) and
// nn::TransformerEncoderLayer (post-norm and pre-norm). Both compute attention with the
// scaled_dot_product_attention op (core/ops/attention.h) unless the attention weights are
// asked for.
#include <cstdint>
#include <string>

#include "models/layers.h"

namespace kiln::nn {

struct MultiheadAttentionOptions {
  double dropout = 0.0;      // on the attention probabilities, in training mode
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // inputs [N, L, E] (true) or [L, N, E] (false), as PyTorch
};

// What a MultiheadAttention call may be given besides query, key and value. The masks
// follow nn.MultiheadAttention's convention: a bool entry that is true is NOT attended to
// (the opposite of scaled_dot_product_attention's), a floating one is added to the scores.
struct MultiheadAttentionCall {
  Tensor key_padding_mask = {};      // [N, S]: keys to ignore per sequence
  Tensor attn_mask = {};             // [L, S] or [N * num_heads, L, S]
  bool need_weights = false;         // also return the attention probabilities, after dropout
                                     // as PyTorch's (the math path)
  bool average_attn_weights = true;  // the weights averaged over the heads
  bool is_causal = false;            // key s > query l is masked (as attn_mask's causal mask)
};

struct MultiheadAttentionResult {
  Tensor output;   // the query's shape
  Tensor weights;  // [N, L, S] averaged, [N, num_heads, L, S] otherwise; undefined unless asked
};

// Multi-head attention: q, k, v projected by in_proj_weight [3E, E] (and in_proj_bias [3E]),
// split into num_heads heads of E / num_heads, attended, concatenated and projected by
// out_proj (a Linear(E, E)). Children and parameters: in_proj_weight, in_proj_bias,
// out_proj.weight, out_proj.bias, as PyTorch names them (its state dicts load).
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});
  MultiheadAttentionResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const MultiheadAttentionCall& call = {});
  // Self-attention without masks: forward(x, x, x).output.
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  // PyTorch's: xavier_uniform_ for in_proj_weight, zero biases, out_proj.weight as Linear's.
  void reset_parameters();
  Tensor in_proj_weight() const { return parameter("in_proj_weight"); }
  Tensor in_proj_bias() const { return parameter("in_proj_bias"); }
  Linear out_proj() const { return out_proj_; }
  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  const MultiheadAttentionOptions& options() const { return options_; }

 private:
  int64_t embed_dim_, num_heads_;
  MultiheadAttentionOptions options_;
  Linear out_proj_;
};

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  // pre-norm: x + block(norm(x)); post-norm: norm(x + block(x))
  bool bias = true;
};

// torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block (linear1,
// activation, dropout, linear2), each with a residual connection, dropout (dropout1,
// dropout2) and a LayerNorm (norm1, norm2), with PyTorch's child names.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                          TransformerEncoderLayerOptions options = {});
  // src_mask and src_key_padding_mask as MultiheadAttention's attn_mask and key_padding_mask.
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = {},
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, {}, {}, false); }
  MultiheadAttention self_attn() const { return self_attn_; }
  const TransformerEncoderLayerOptions& options() const { return options_; }

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding,
                              bool is_causal);
  Tensor feed_forward_block(const Tensor& x);

  TransformerEncoderLayerOptions options_;
  MultiheadAttention self_attn_;
  Linear linear1_;
  Dropout dropout_;
  Linear linear2_;
  LayerNorm norm1_, norm2_;
  Dropout dropout1_, dropout2_;
};

}  // namespace kiln::nn
