#pragma once
// BERT (Devlin et al. 2018) as Hugging Face's transformers builds it (modeling_bert.py):
// the same module tree and parameter names ("bert.encoder.layer.0.attention.self.query.weight",
// "cls.predictions.transform.LayerNorm.bias"), so a safetensors file saved by HF's
// BertForMaskedLM or BertForSequenceClassification loads with load_hf_state_dict, and the
// same initialization (N(0, 0.02) weights, zero biases, the padding token's embedding row
// zero). Attention is the fused scaled_dot_product_attention op with a key padding mask.
//
// Inputs follow HF's and the data layer's (data/text.h) conventions: input_ids i64 [N, L],
// attention_mask i64 or bool [N, L] (1 for a token, 0 for padding), token_type_ids i64
// [N, L] (0 for the first segment, 1 for the second; all 0 when not given).
#include <cstdint>
#include <optional>
#include <string>

#include "models/layers.h"
#include "models/state_dict.h"

namespace kiln::models {

// The hyperparameters of a BERT, named as in HF's config.json.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double hidden_dropout_prob = 0.1;           // after embeddings, projections and the pooler
  double attention_probs_dropout_prob = 0.1;  // on the attention probabilities
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;  // the standard deviation of the initial weights
  int64_t pad_token_id = 0;         // its embedding row starts at zero and gets no gradient

  // The sizes of the four configurations (intermediate 4x hidden, the rest as above).
  static BertConfig tiny(int64_t vocab_size = 30522);   // 2 layers, hidden 128, 2 heads
  static BertConfig mini(int64_t vocab_size = 30522);   // 4 layers, hidden 256, 4 heads
  static BertConfig base(int64_t vocab_size = 30522);   // 12 layers, hidden 768, 12 heads
  static BertConfig large(int64_t vocab_size = 30522);  // 24 layers, hidden 1024, 16 heads
};

// Word, position and token-type embeddings summed, then LayerNorm and dropout.
class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& config);
  // [N, L, hidden] from input_ids [N, L] and token_type_ids [N, L] (undefined: all 0); an
  // id outside its table is an error naming `model`.
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids,
                 const char* model = "BertEmbeddings");
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, {}); }
  nn::Embedding word_embeddings() const { return word_embeddings_; }

 private:
  nn::Embedding word_embeddings_, position_embeddings_, token_type_embeddings_;
  nn::LayerNorm layer_norm_;
  nn::Dropout dropout_;
};

// Multi-head self-attention with separate query, key and value projections (HF's
// BertSelfAttention); the heads' outputs concatenated, before the output projection.
class BertSelfAttention : public nn::Module {
 public:
  explicit BertSelfAttention(const BertConfig& config);
  // x [N, L, hidden]; keys [N, 1, 1, L] bool (true: attended) or undefined.
  Tensor forward(const Tensor& x, const Tensor& keys);
  Tensor forward(const Tensor& x) override { return forward(x, {}); }

 private:
  int64_t heads_;
  double dropout_p_;
  nn::Linear query_, key_, value_;
};

// dense, dropout, then LayerNorm of the sum with the residual: HF's BertSelfOutput (after
// attention, in = hidden) and BertOutput (after the intermediate layer, in = intermediate).
class BertOutput : public nn::Module {
 public:
  BertOutput(const BertConfig& config, int64_t in_features);
  Tensor forward(const Tensor& x, const Tensor& residual);

 private:
  nn::Linear dense_;
  nn::LayerNorm layer_norm_;
  nn::Dropout dropout_;
};

// Children "self" (BertSelfAttention) and "output" (BertOutput).
class BertAttention : public nn::Module {
 public:
  explicit BertAttention(const BertConfig& config);
  Tensor forward(const Tensor& x, const Tensor& keys);

 private:
  BertSelfAttention self_;
  BertOutput output_;
};

// One encoder layer: attention, then intermediate (dense, GELU with erf) and output.
class BertLayer : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& config);
  Tensor forward(const Tensor& x, const Tensor& keys);

 private:
  BertAttention attention_;
  nn::Module intermediate_;  // holds "dense"
  nn::Linear intermediate_dense_;
  BertOutput output_;
};

// The encoder, its layers a ModuleList "layer", and optionally the pooler (tanh of a dense
// layer over the first token's hidden state). HF's BertModel.
class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& config, bool add_pooling_layer = true);
  struct Output {
    Tensor last_hidden_state;  // [N, L, hidden]
    Tensor pooler_output;      // [N, hidden]; undefined without the pooler
  };
  // Checks the inputs (dtype, shape, length, ids in the vocabulary: an error naming
  // `model`, the model the caller is), then embeddings and the encoder.
  Output forward(const Tensor& input_ids, const Tensor& attention_mask,
                 const Tensor& token_type_ids = {}, const char* model = "BertModel");
  Tensor forward(const Tensor& input_ids) override {
    return forward(input_ids, {}, {}).last_hidden_state;
  }
  const BertConfig& config() const { return config_; }
  BertEmbeddings embeddings() const { return embeddings_; }

 private:
  BertConfig config_;
  BertEmbeddings embeddings_;
  nn::Module encoder_;  // holds "layer"
  nn::ModuleList layers_;
  std::optional<nn::Linear> pooler_dense_;  // "pooler.dense"
};

// Masked-LM: the encoder without the pooler ("bert") and the prediction head
// "cls.predictions": dense, GELU, LayerNorm ("transform"), then the word embeddings
// transposed (tied, as HF's decoder weight) plus the bias "cls.predictions.bias".
class BertForMaskedLM : public nn::Module {
 public:
  explicit BertForMaskedLM(const BertConfig& config);
  // Logits [N, L, vocab_size].
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask,
                 const Tensor& token_type_ids = {});
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, {}, {}); }
  BertModel bert() const { return bert_; }
  // Loads a state dict with HF's names, leaving out the entries HF itself does not load
  // into this model: the tied decoder ("cls.predictions.decoder.*"), the position and
  // token-type id buffers, and a pretraining checkpoint's pooler and next-sentence head.
  void load_hf_state_dict(const StateDict& state);

 private:
  BertModel bert_;
  nn::Module cls_, predictions_, transform_;
  nn::Linear transform_dense_;
  nn::LayerNorm transform_layer_norm_;
  Tensor bias_;
};

// Sequence classification: the pooled first token, dropout, and "classifier" (a Linear to
// num_labels logits).
class BertForSequenceClassification : public nn::Module {
 public:
  BertForSequenceClassification(const BertConfig& config, int64_t num_labels);
  // Logits [N, num_labels].
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask,
                 const Tensor& token_type_ids = {});
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, {}, {}); }
  BertModel bert() const { return bert_; }
  // Loads a state dict with HF's names, leaving out the id buffers and a pretraining
  // checkpoint's heads ("cls.*"), which HF ignores too.
  void load_hf_state_dict(const StateDict& state);

 private:
  BertModel bert_;
  nn::Dropout dropout_;
  nn::Linear classifier_;
};

// The masked-LM loss: mean cross entropy of logits [N, L, V] against labels i64 [N, L] over
// the positions whose label is not -100 (the data layer's MaskedLM targets). NaN when every
// label is -100, as PyTorch's.
Tensor masked_lm_loss(const Tensor& logits, const Tensor& labels);

}  // namespace kiln::models
