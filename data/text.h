#pragma once
// Text data sets for the transformer models, tokenized with WordPiece (data/wordpiece.h).
// Their samples are i64 [length] token ids; the loader pads each batch and gives a mask
// (Dataset::padding_id, LoaderOptions::pad_multiple).
//
//   auto wp = std::make_shared<const data::WordPiece>(data::train_wordpiece(corpus, {.vocab_size =
//   4096})); auto text = std::make_shared<const data::PackedText>(corpus, wp, 128); auto mlm =
//   std::make_shared<const data::MaskedLM>(text, wp); data::Loader loader(mlm, {.batch_size = 32,
//   .shuffle = true, .seed = 1});
//   // batch.input i64 [32, 128] with [MASK]s, batch.target i64 [32, 128] (-100 where none),
//   // batch.mask i64 [32, 128] (0 on padding)
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/wordpiece.h"

namespace kiln::data {

// A labelled text task: texts[i] has class labels[i], 0 <= label < class_names.size().
struct TextTask {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;
  std::vector<std::string> class_names;
};

// Documents packed into blocks for language-model pretraining: every document's tokens
// followed by [SEP], all in one stream, cut into pieces of seq_len - 1 tokens; sample i is
// [CLS] + piece i, so every sample has seq_len tokens except the last, which the loader
// pads. num_classes() is the vocabulary size (the classes of a per-token prediction).
class PackedText : public Dataset {
 public:
  // kiln::Error for a null tokenizer, seq_len < 2 or an empty stream (no documents).
  PackedText(const std::vector<std::string>& documents, std::shared_ptr<const WordPiece> tokenizer,
             int64_t seq_len, std::string name = "text");
  int64_t size() const override;
  int64_t num_classes() const override { return tokenizer_->vocab_size(); }
  std::vector<int64_t> sample_shape() const override { return {seq_len_}; }
  std::optional<int64_t> padding_id() const override { return tokenizer_->pad_id(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  // The token stream: the documents' tokens, each document followed by [SEP].
  const std::vector<int32_t>& stream() const { return stream_; }
  int64_t documents() const { return documents_; }
  const WordPiece& tokenizer() const { return *tokenizer_; }

 private:
  std::shared_ptr<const WordPiece> tokenizer_;
  int64_t seq_len_;
  std::string name_;
  int64_t documents_ = 0;
  std::vector<int32_t> stream_;
};

// A labelled text task, each text as [CLS] tokens [SEP] cut to max_length (the tokens cut,
// [SEP] kept, as Hugging Face's truncation does).
class TextClassification : public Dataset {
 public:
  // kiln::Error for a null tokenizer, max_length < 2, texts and labels of different
  // counts, no class names, or a label outside [0, class_names.size()).
  TextClassification(const TextTask& task, std::shared_ptr<const WordPiece> tokenizer,
                     int64_t max_length, std::string name = "text classification");
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(class_names_.size()); }
  std::vector<int64_t> sample_shape() const override { return {max_length_}; }
  std::optional<int64_t> padding_id() const override { return tokenizer_->pad_id(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  const std::vector<std::string>& class_names() const { return class_names_; }
  const std::vector<int64_t>& labels() const { return labels_; }
  // How many texts were longer than max_length and cut.
  int64_t truncated() const { return truncated_; }

 private:
  std::shared_ptr<const WordPiece> tokenizer_;
  int64_t max_length_;
  std::string name_;
  std::vector<std::string> class_names_;
  std::vector<int64_t> labels_;
  std::vector<int32_t> tokens_;  // every sample's ids, [CLS] and [SEP] included, end to end
  std::vector<int64_t> starts_;  // sample i is tokens_[starts_[i], starts_[i + 1])
  int64_t truncated_ = 0;
};

struct MaskedLMOptions {
  double mask_prob = 0.15;         // of the non-special tokens, chosen independently
  double mask_token_prob = 0.8;    // of the chosen: replaced by [MASK]
  double random_token_prob = 0.1;  // of the chosen: replaced by a random non-special token
  // the rest of the chosen (0.1) stay unchanged
};

// BERT's masked-LM corruption over a token-sequence data set: each non-special token is
// chosen with mask_prob and then replaced by [MASK], by a random non-special token or kept
// (80/10/10); the sample's target holds the original token where chosen, kIgnoreIndex
// elsewhere. Draws come from the sample's SampleRng, so a sample's masking is a pure
// function of (loader seed, epoch, index): the same for any worker count, new each epoch.
class MaskedLM : public Dataset {
 public:
  // kiln::Error for a null base or tokenizer, a base that is not a token-sequence data set
  // or pads with another id, probabilities outside [0, 1] or mask + random above 1.
  MaskedLM(std::shared_ptr<const Dataset> base, std::shared_ptr<const WordPiece> tokenizer,
           MaskedLMOptions options = {});
  int64_t size() const override { return base_->size(); }
  int64_t num_classes() const override { return tokenizer_->vocab_size(); }
  std::vector<int64_t> sample_shape() const override { return base_->sample_shape(); }
  std::optional<int64_t> padding_id() const override { return base_->padding_id(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  std::shared_ptr<const Dataset> base_;
  std::shared_ptr<const WordPiece> tokenizer_;
  MaskedLMOptions options_;
  std::vector<int64_t> ordinary_;  // the non-special ids, for random replacements
};

// Next-token prediction over a token-sequence data set (causal LM, GPT-style): the
// sample's target is its input shifted left by one, target[i] = input[i + 1], and
// kIgnoreIndex at the last position (its next token is not in the sample), so a model's
// logits at every position meet a plain cross-entropy with ignore_index -100.
class CausalLM : public Dataset {
 public:
  // kiln::Error for a null base or tokenizer, a base that is not a token-sequence data set
  // or pads with another id.
  CausalLM(std::shared_ptr<const Dataset> base, std::shared_ptr<const WordPiece> tokenizer);
  int64_t size() const override { return base_->size(); }
  int64_t num_classes() const override { return tokenizer_->vocab_size(); }
  std::vector<int64_t> sample_shape() const override { return base_->sample_shape(); }
  std::optional<int64_t> padding_id() const override { return base_->padding_id(); }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  std::shared_ptr<const Dataset> base_;
  std::shared_ptr<const WordPiece> tokenizer_;
};

// The entropy, in bits per token, of the unigram distribution of the non-special tokens
// in `tokens`: the cross-entropy of the best model that ignores context, the baseline a
// language model's loss (in nats: times ln 2) should fall well below.
double unigram_entropy_bits(const std::vector<int32_t>& tokens, const WordPiece& tokenizer);

// The masked-LM loss, in bits per predicted token, of the best model that sees no context
// (only the corrupted token at the position), for the unigram distribution of `tokens`:
// below unigram_entropy_bits, because a position left unchanged shows its answer. With
// p_x the unigram probabilities over the N non-special ids, H their entropy, and r =
// keep / random_token_prob (how much likelier "left unchanged" makes the token shown the
// answer than "random" does: the posterior of o given x is p_o (r 1[o = x] + 1/N) /
// (r p_x + 1/N)), the best loss is, shown
//   [MASK]:           H
//   a random token:   H + (sum_x log2(1 + r N p_x) - log2(1 + r N)) / N
//   the token itself: sum_x p_x log2((r N p_x + 1) / (p_x (r N + 1)))
// weighted mask_token_prob, random_token_prob and keep = 1 - the two.
double masked_lm_baseline_bits(const std::vector<int32_t>& tokens, const WordPiece& tokenizer,
                               const MaskedLMOptions& options = {});

}  // namespace kiln::data
