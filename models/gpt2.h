#pragma once
// GPT-2 (Radford et al. 2019), a causal decoder, as Hugging Face's transformers builds it
// (modeling_gpt2.py): pre-norm blocks, GELU with the tanh approximation, learned positions,
// the output projection tied to the token embeddings, and HF's module tree and parameter
// names ("transformer.h.0.attn.c_attn.weight"), so that a safetensors file saved by HF's
// GPT2LMHeadModel loads with load_hf_state_dict. Attention is scaled_dot_product_attention
// with is_causal (and an optional key padding mask).
#include <cstdint>

#include "models/layers.h"
#include "models/state_dict.h"

namespace kiln::models {

// The hyperparameters of a GPT-2, named as in HF's config.json.
struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // the MLP's width; 0 means 4 * n_embd
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;

  // GPT-2 small, 124M parameters with the embeddings tied: 12 layers, 768 wide, 12 heads.
  static GPT2Config small(int64_t vocab_size = 50257);
  // For tests and CPU training: 2 layers, 128 wide, 2 heads, 512 positions.
  static GPT2Config tiny(int64_t vocab_size = 50257);
  // 4 layers, 256 wide, 4 heads, 512 positions.
  static GPT2Config mini(int64_t vocab_size = 50257);
};

// HF's Conv1D (its name, kept for the state dicts): a linear layer whose weight is stored
// [in, out], transposed against nn::Linear's, so y = x W + b. GPT-2's files hold it so.
class Conv1D : public nn::Module {
 public:
  Conv1D(int64_t in_features, int64_t out_features);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor weight() const { return parameter("weight"); }  // [in, out]
  Tensor bias() const { return parameter("bias"); }      // [out]
};

// Causal self-attention: c_attn projects to q, k and v at once, c_proj back.
class GPT2Attention : public nn::Module {
 public:
  explicit GPT2Attention(const GPT2Config& config);
  // x [N, L, E]; keys [N, 1, 1, L] bool (true: attended) or undefined.
  Tensor forward(const Tensor& x, const Tensor& keys);
  Tensor forward(const Tensor& x) override { return forward(x, {}); }

 private:
  int64_t heads_;
  double attn_pdrop_;
  Conv1D c_attn_, c_proj_;
  nn::Dropout resid_dropout_;
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)); mlp: c_fc, GELU (tanh), c_proj, dropout.
class GPT2Block : public nn::Module {
 public:
  explicit GPT2Block(const GPT2Config& config);
  Tensor forward(const Tensor& x, const Tensor& keys);
  Tensor forward(const Tensor& x) override { return forward(x, {}); }

 private:
  nn::LayerNorm ln_1_;
  GPT2Attention attn_;
  nn::LayerNorm ln_2_;
  nn::Module mlp_;  // holds c_fc, c_proj and dropout
  Conv1D c_fc_, c_proj_;
  nn::Dropout mlp_dropout_;
};

// The decoder: token (wte) and position (wpe) embeddings, dropout, the blocks ("h") and
// the final LayerNorm (ln_f). HF's GPT2Model.
class GPT2Model : public nn::Module {
 public:
  explicit GPT2Model(const GPT2Config& config);
  // The final hidden states [N, L, n_embd] from input_ids i64 [N, L] and attention_mask i64
  // or bool [N, L] (1: a token, 0: padding; undefined: all tokens). Bad inputs are errors
  // naming `model`, the model the caller is.
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask,
                 const char* model = "GPT2Model");
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, {}); }
  const GPT2Config& config() const { return config_; }
  nn::Embedding wte() const { return wte_; }

 private:
  GPT2Config config_;
  nn::Embedding wte_, wpe_;
  nn::Dropout drop_;
  nn::ModuleList h_;
  nn::LayerNorm ln_f_;
};

// The language model: "transformer" (GPT2Model) and the logits from the token embeddings
// transposed (HF's lm_head, tied to transformer.wte, so not a parameter of its own).
class GPT2LMHeadModel : public nn::Module {
 public:
  explicit GPT2LMHeadModel(const GPT2Config& config);
  // Logits [N, L, vocab_size].
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask);
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, {}); }
  GPT2Model transformer() const { return transformer_; }
  // Loads a state dict with HF's names, leaving out what HF does not load either: the tied
  // lm_head.weight and the attention's causal-mask buffers (attn.bias, attn.masked_bias). A
  // GPT2Model file (names without "transformer.", as the hub's gpt2 checkpoint) loads too.
  void load_hf_state_dict(const StateDict& state);

 private:
  GPT2Model transformer_;
};

// The causal-LM loss of HF's GPT2LMHeadModel: position i's logits predict labels[i + 1]
// (labels i64 [N, L], usually input_ids, shifted left with -100 after the last, as HF's
// loss does it now); mean cross entropy over the labels that are not -100. The data layer's
// CausalLM targets are shifted already: give those to cross_entropy directly.
Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels);

}  // namespace kiln::models
