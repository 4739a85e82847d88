// BERT with Hugging Face's module tree, names and initialization (models/bert.h).
#include "models/bert.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/linalg.h"
#include "core/ops/loss.h"
#include "models/init.h"
#include "models/token_inputs.h"

namespace kiln::models {

namespace {

BertConfig sized(int64_t vocab_size, int64_t layers, int64_t hidden, int64_t heads) {
  return {.vocab_size = vocab_size,
          .hidden_size = hidden,
          .num_hidden_layers = layers,
          .num_attention_heads = heads,
          .intermediate_size = 4 * hidden};
}

const BertConfig& checked(const BertConfig& c) {
  KILN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers >= 0 &&
                 c.intermediate_size > 0 && c.max_position_embeddings > 0 && c.type_vocab_size > 0,
             "BERT: sizes must be positive (vocab_size {}, hidden_size {}, num_hidden_layers {}, "
             "intermediate_size {}, max_position_embeddings {}, type_vocab_size {})",
             c.vocab_size, c.hidden_size, c.num_hidden_layers, c.intermediate_size,
             c.max_position_embeddings, c.type_vocab_size);
  KILN_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0,
             "BERT: hidden_size ({}) must be a positive multiple of num_attention_heads ({})",
             c.hidden_size, c.num_attention_heads);
  KILN_CHECK(c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size,
             "BERT: pad_token_id {} is outside the vocabulary of {}", c.pad_token_id, c.vocab_size);
  return c;
}

nn::LayerNorm layer_norm_of(const BertConfig& c) {
  return nn::LayerNorm({c.hidden_size}, {.eps = c.layer_norm_eps});
}

// HF's _init_weights: every Linear and Embedding weight N(0, initializer_range^2), biases
// zero, the padding row zero; LayerNorms start as ones and zeros already.
void initialize(nn::Module& model, double std) {
  for (nn::Module* m : model.modules()) {
    if (auto* linear = dynamic_cast<nn::Linear*>(m)) {
      nn::init::normal_(linear->weight(), 0.0, std);
      if (linear->bias().defined()) nn::init::zeros_(linear->bias());
    } else if (auto* embedding = dynamic_cast<nn::Embedding*>(m)) {
      nn::init::normal_(embedding->weight(), 0.0, std);
      if (embedding->padding_idx())
        nn::init::zeros_(embedding->weight().select(0, *embedding->padding_idx()));
    }
  }
}

// state without the keys `drop` names exactly or starts with (a prefix ending in '.').
StateDict without(const StateDict& state, const std::vector<std::string>& drop) {
  StateDict kept;
  for (const auto& [name, t] : state) {
    bool dropped = false;
    for (const std::string& d : drop) dropped |= d.back() == '.' ? name.starts_with(d) : name == d;
    if (!dropped) kept.emplace(name, t);
  }
  return kept;
}

// Buffers HF's BertEmbeddings registers (position_ids persistent in older versions); kiln
// computes both from the input's shape.
const std::vector<std::string> kIdBuffers = {"bert.embeddings.position_ids",
                                             "bert.embeddings.token_type_ids"};

}  // namespace

BertConfig BertConfig::tiny(int64_t vocab_size) { return sized(vocab_size, 2, 128, 2); }
BertConfig BertConfig::mini(int64_t vocab_size) { return sized(vocab_size, 4, 256, 4); }
BertConfig BertConfig::base(int64_t vocab_size) { return sized(vocab_size, 12, 768, 12); }
BertConfig BertConfig::large(int64_t vocab_size) { return sized(vocab_size, 24, 1024, 16); }

// ---- embeddings ----

BertEmbeddings::BertEmbeddings(const BertConfig& c)
    : word_embeddings_(add("word_embeddings", nn::Embedding(c.vocab_size, c.hidden_size,
                                                            {.padding_idx = c.pad_token_id}))),
      position_embeddings_(
          add("position_embeddings", nn::Embedding(c.max_position_embeddings, c.hidden_size))),
      token_type_embeddings_(
          add("token_type_embeddings", nn::Embedding(c.type_vocab_size, c.hidden_size))),
      layer_norm_(add("LayerNorm", layer_norm_of(c))),
      dropout_(add("dropout", nn::Dropout(c.hidden_dropout_prob))) {}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids,
                               const char* model) {
  check_input_ids(model, input_ids, position_embeddings_.weight().size(0));
  const int64_t L = input_ids.size(1);
  Tensor x = embed_ids(model, "input_ids", word_embeddings_, input_ids);
  // Positions 0..L-1 are the table's first L rows: a slice, broadcast over the batch.
  x = kiln::add(x, position_embeddings_.weight().slice(0, 0, L));
  x = kiln::add(x, token_type_ids.defined()
                       ? embed_ids(model, "token_type_ids", token_type_embeddings_, token_type_ids)
                       : token_type_embeddings_.weight().select(0, 0));
  return dropout_(layer_norm_(x));
}

// ---- one layer ----

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : heads_(c.num_attention_heads),
      dropout_p_(c.attention_probs_dropout_prob),
      query_(add("query", nn::Linear(c.hidden_size, c.hidden_size))),
      key_(add("key", nn::Linear(c.hidden_size, c.hidden_size))),
      value_(add("value", nn::Linear(c.hidden_size, c.hidden_size))) {}

Tensor BertSelfAttention::forward(const Tensor& x, const Tensor& keys) {
  const int64_t n = x.size(0), L = x.size(1), E = x.size(2);
  // [N, L, E] -> [N, H, L, E / H]; the attention op reads the heads in place.
  auto heads = [&](nn::Linear& proj) {
    return proj(x).unflatten(-1, {heads_, E / heads_}).transpose(1, 2);
  };
  const Tensor out = scaled_dot_product_attention(
      heads(query_), heads(key_), heads(value_),
      {.attn_mask = keys, .dropout_p = is_training() ? dropout_p_ : 0.0});
  return out.transpose(1, 2).reshape({n, L, E});
}

BertOutput::BertOutput(const BertConfig& c, int64_t in_features)
    : dense_(add("dense", nn::Linear(in_features, c.hidden_size))),
      layer_norm_(add("LayerNorm", layer_norm_of(c))),
      dropout_(add("dropout", nn::Dropout(c.hidden_dropout_prob))) {}

Tensor BertOutput::forward(const Tensor& x, const Tensor& residual) {
  return layer_norm_(kiln::add(dropout_(dense_(x)), residual));
}

BertAttention::BertAttention(const BertConfig& c)
    : self_(add("self", BertSelfAttention(c))),
      output_(add("output", BertOutput(c, c.hidden_size))) {}

Tensor BertAttention::forward(const Tensor& x, const Tensor& keys) {
  return output_.forward(self_.forward(x, keys), x);
}

BertLayer::BertLayer(const BertConfig& c)
    : attention_(add("attention", BertAttention(c))),
      intermediate_(add("intermediate", nn::Module())),
      intermediate_dense_(
          intermediate_.add("dense", nn::Linear(c.hidden_size, c.intermediate_size))),
      output_(add("output", BertOutput(c, c.intermediate_size))) {}

Tensor BertLayer::forward(const Tensor& x, const Tensor& keys) {
  const Tensor a = attention_.forward(x, keys);
  return output_.forward(gelu(intermediate_dense_(a)), a);
}

// ---- the encoder ----

BertModel::BertModel(const BertConfig& config, bool add_pooling_layer)
    : config_(checked(config)),
      embeddings_(add("embeddings", BertEmbeddings(config))),
      encoder_(add("encoder", nn::Module())),
      layers_(encoder_.add("layer", nn::ModuleList())) {
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers_.push_back(BertLayer(config));
  if (add_pooling_layer) {
    pooler_dense_ = add("pooler", nn::Module())
                        .add("dense", nn::Linear(config.hidden_size, config.hidden_size));
  }
  initialize(*this, config.initializer_range);
}

BertModel::Output BertModel::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                     const Tensor& token_type_ids, const char* model) {
  check_input_ids(model, input_ids, config_.max_position_embeddings);
  check_per_token(model, "attention_mask", attention_mask, input_ids, true);
  check_per_token(model, "token_type_ids", token_type_ids, input_ids, false);
  const Tensor keys = key_padding_mask(attention_mask);
  Tensor x = embeddings_.forward(input_ids, token_type_ids, model);
  for (int64_t i = 0; i < layers_.size(); ++i) x = layers_.at<BertLayer>(i).forward(x, keys);
  Output out{.last_hidden_state = x};
  if (pooler_dense_) out.pooler_output = tanh((*pooler_dense_)(x.select(1, 0)));
  return out;
}

// ---- heads ----

BertForMaskedLM::BertForMaskedLM(const BertConfig& config)
    : bert_(add("bert", BertModel(config, /*add_pooling_layer=*/false))),
      cls_(add("cls", nn::Module())),
      predictions_(cls_.add("predictions", nn::Module())),
      transform_(predictions_.add("transform", nn::Module())),
      transform_dense_(transform_.add("dense", nn::Linear(config.hidden_size, config.hidden_size))),
      transform_layer_norm_(transform_.add("LayerNorm", layer_norm_of(config))),
      bias_(predictions_.add_parameter("bias", zeros({config.vocab_size}))) {
  initialize(transform_, config.initializer_range);  // bert_ initialized itself
}

Tensor BertForMaskedLM::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                const Tensor& token_type_ids) {
  const Tensor h =
      bert_.forward(input_ids, attention_mask, token_type_ids, "BertForMaskedLM").last_hidden_state;
  const Tensor t = transform_layer_norm_(gelu(transform_dense_(h)));
  // The decoder is the word embeddings transposed (HF ties them).
  return kiln::add(matmul(t, bert_.embeddings().word_embeddings().weight().t()), bias_);
}

void BertForMaskedLM::load_hf_state_dict(const StateDict& state) {
  StateDict kept = without(state, kIdBuffers);
  kept = without(kept, {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                        "bert.pooler.", "cls.seq_relationship."});
  load_state_dict(kept);
}

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& config,
                                                             int64_t num_labels)
    : bert_(add("bert", BertModel(config))),
      dropout_(add("dropout", nn::Dropout(config.hidden_dropout_prob))),
      classifier_(
          add("classifier", nn::Linear(config.hidden_size, num_labels > 0 ? num_labels : 1))) {
  KILN_CHECK(num_labels > 0, "BertForSequenceClassification: num_labels must be positive, got {}",
             num_labels);
  initialize(classifier_, config.initializer_range);  // bert_ initialized itself
}

Tensor BertForSequenceClassification::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                              const Tensor& token_type_ids) {
  const Tensor pooled =
      bert_.forward(input_ids, attention_mask, token_type_ids, "BertForSequenceClassification")
          .pooler_output;
  return classifier_(dropout_(pooled));
}

void BertForSequenceClassification::load_hf_state_dict(const StateDict& state) {
  load_state_dict(without(without(state, kIdBuffers), {"cls."}));
}

Tensor masked_lm_loss(const Tensor& logits, const Tensor& labels) {
  KILN_CHECK(logits.defined() && labels.defined() && logits.dim() == 3 &&
                 labels.dtype() == DType::i64 &&
                 labels.shape() == Shape({logits.size(0), logits.size(1)}),
             "masked_lm_loss: logits must be [N, L, V] and labels i64 [N, L], got {} and {}",
             logits.defined() ? logits.meta_str() : "undefined",
             labels.defined() ? labels.meta_str() : "undefined");
  return cross_entropy(logits.reshape({-1, logits.size(2)}), labels.reshape({-1}),
                       {.ignore_index = -100});
}

}  // namespace kiln::models
