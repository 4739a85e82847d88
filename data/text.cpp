#include "data/text.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "core/ops/factory.h"

namespace kiln::data {

namespace {

Tensor ids_tensor(const int32_t* ids, int64_t n) {
  Tensor t = empty({n}, {.dtype = DType::i64});
  int64_t* out = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out[i] = ids[i];
  return t;
}

// A wrapper's base must be a token-sequence data set padded with the tokenizer's [PAD].
void check_token_base(const char* who, const std::shared_ptr<const Dataset>& base,
                      const std::shared_ptr<const WordPiece>& tokenizer) {
  KILN_CHECK(base != nullptr && tokenizer != nullptr,
             "{}: the base data set or the tokenizer is null", who);
  KILN_CHECK(base->padding_id().has_value(), "{}: {} is not a token-sequence data set", who,
             base->describe());
  KILN_CHECK(*base->padding_id() == tokenizer->pad_id(),
             "{}: {} pads with id {}, but the tokenizer's [PAD] is {}", who, base->describe(),
             *base->padding_id(), tokenizer->pad_id());
}

// The base sample of a wrapper, checked to be i64 [length].
Sample token_sample(const char* who, const Dataset& base, int64_t index, SampleRng& rng) {
  Sample s = base.get(index, rng);
  KILN_CHECK(s.input.defined() && s.input.dtype() == DType::i64 && s.input.dim() == 1,
             "{}: sample {} of {} is {}, not i64[length]", who, index, base.describe(),
             s.input.defined() ? s.input.meta_str() : "undefined");
  return s;
}

void check_index(const Dataset& d, int64_t index) {
  KILN_CHECK(index >= 0 && index < d.size(), "{}: sample {} outside [0, {})", d.describe(), index,
             d.size());
}

}  // namespace

PackedText::PackedText(const std::vector<std::string>& documents,
                       std::shared_ptr<const WordPiece> tokenizer, int64_t seq_len,
                       std::string name)
    : tokenizer_(std::move(tokenizer)), seq_len_(seq_len), name_(std::move(name)) {
  KILN_CHECK(tokenizer_ != nullptr, "PackedText {}: the tokenizer is null", name_);
  KILN_CHECK(seq_len_ >= 2, "PackedText {}: seq_len {} must be at least 2 ([CLS] and one token)",
             name_, seq_len_);
  for (const std::string& doc : documents) {
    for (int64_t id : tokenizer_->tokenize(doc)) stream_.push_back(static_cast<int32_t>(id));
    stream_.push_back(static_cast<int32_t>(tokenizer_->sep_id()));
  }
  documents_ = static_cast<int64_t>(documents.size());
  KILN_CHECK(!stream_.empty(), "PackedText {}: no documents to pack", name_);
}

int64_t PackedText::size() const {
  const auto n = static_cast<int64_t>(stream_.size());
  const int64_t piece = seq_len_ - 1;
  return n / piece + (n % piece != 0 ? 1 : 0);
}

Sample PackedText::get(int64_t index, SampleRng&) const {
  check_index(*this, index);
  const int64_t piece = seq_len_ - 1;
  const int64_t first = index * piece;
  const int64_t count = std::min(piece, static_cast<int64_t>(stream_.size()) - first);
  Tensor t = empty({count + 1}, {.dtype = DType::i64});
  int64_t* out = t.data_ptr<int64_t>();
  out[0] = tokenizer_->cls_id();
  for (int64_t i = 0; i < count; ++i) out[i + 1] = stream_[static_cast<size_t>(first + i)];
  return Sample{std::move(t), 0};
}

std::string PackedText::describe() const {
  return fmt::format(
      "{}: {} blocks of {} tokens ({} documents, {} tokens with their [SEP]s, vocabulary {})",
      name_, size(), seq_len_, documents_, stream_.size(), tokenizer_->vocab_size());
}

TextClassification::TextClassification(const TextTask& task,
                                       std::shared_ptr<const WordPiece> tokenizer,
                                       int64_t max_length, std::string name)
    : tokenizer_(std::move(tokenizer)),
      max_length_(max_length),
      name_(std::move(name)),
      class_names_(task.class_names),
      labels_(task.labels) {
  KILN_CHECK(tokenizer_ != nullptr, "TextClassification {}: the tokenizer is null", name_);
  KILN_CHECK(max_length_ >= 2,
             "TextClassification {}: max_length {} must be at least 2 ([CLS] and [SEP])", name_,
             max_length_);
  KILN_CHECK(task.texts.size() == task.labels.size(),
             "TextClassification {}: {} texts but {} labels", name_, task.texts.size(),
             task.labels.size());
  KILN_CHECK(!class_names_.empty(), "TextClassification {}: no class names", name_);
  starts_.reserve(task.texts.size() + 1);
  starts_.push_back(0);
  for (size_t i = 0; i < task.texts.size(); ++i) {
    KILN_CHECK(labels_[i] >= 0 && labels_[i] < num_classes(),
               "TextClassification {}: text {} has label {}, outside [0, {})", name_, i, labels_[i],
               num_classes());
    std::vector<int64_t> ids = tokenizer_->encode(task.texts[i]);
    if (static_cast<int64_t>(ids.size()) > max_length_) {
      ids.resize(static_cast<size_t>(max_length_));
      ids.back() = tokenizer_->sep_id();
      ++truncated_;
    }
    for (int64_t id : ids) tokens_.push_back(static_cast<int32_t>(id));
    starts_.push_back(static_cast<int64_t>(tokens_.size()));
  }
}

Sample TextClassification::get(int64_t index, SampleRng&) const {
  check_index(*this, index);
  const auto i = static_cast<size_t>(index);
  return Sample{ids_tensor(tokens_.data() + starts_[i], starts_[i + 1] - starts_[i]), labels_[i]};
}

std::string TextClassification::describe() const {
  return fmt::format("{}: {} texts, {} classes, at most {} tokens ({} cut)", name_, size(),
                     num_classes(), max_length_, truncated_);
}

MaskedLM::MaskedLM(std::shared_ptr<const Dataset> base, std::shared_ptr<const WordPiece> tokenizer,
                   MaskedLMOptions options)
    : base_(std::move(base)), tokenizer_(std::move(tokenizer)), options_(options) {
  check_token_base("MaskedLM", base_, tokenizer_);
  const auto in_unit = [](double p) { return p >= 0.0 && p <= 1.0; };
  KILN_CHECK(in_unit(options_.mask_prob) && in_unit(options_.mask_token_prob) &&
                 in_unit(options_.random_token_prob) &&
                 options_.mask_token_prob + options_.random_token_prob <= 1.0,
             "MaskedLM: mask_prob {}, mask_token_prob {} and random_token_prob {} must lie in [0, "
             "1], the last two "
             "summing to at most 1",
             options_.mask_prob, options_.mask_token_prob, options_.random_token_prob);
  for (int64_t id = 0; id < tokenizer_->vocab_size(); ++id)
    if (!tokenizer_->is_special(id)) ordinary_.push_back(id);
  KILN_CHECK(!ordinary_.empty(), "MaskedLM: the vocabulary holds only special tokens");
}

Sample MaskedLM::get(int64_t index, SampleRng& rng) const {
  Sample s = token_sample("MaskedLM", *base_, index, rng);
  Tensor input = s.input.contiguous().clone();
  const int64_t n = input.shape()[0];
  Tensor target = empty({n}, {.dtype = DType::i64});
  int64_t* ids = input.data_ptr<int64_t>();
  int64_t* out = target.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    out[i] = kIgnoreIndex;
    if (tokenizer_->is_special(ids[i]) || rng.uniform() >= options_.mask_prob) continue;
    out[i] = ids[i];
    const double u = rng.uniform();
    if (u < options_.mask_token_prob)
      ids[i] = tokenizer_->mask_id();
    else if (u < options_.mask_token_prob + options_.random_token_prob)
      ids[i] = ordinary_[rng.below(ordinary_.size())];
  }
  s.input = std::move(input);
  s.target = std::move(target);
  return s;
}

std::string MaskedLM::describe() const {
  return fmt::format("masked LM ({:g}% of tokens: {:g}% [MASK], {:g}% random) over {}",
                     100 * options_.mask_prob, 100 * options_.mask_token_prob,
                     100 * options_.random_token_prob, base_->describe());
}

CausalLM::CausalLM(std::shared_ptr<const Dataset> base, std::shared_ptr<const WordPiece> tokenizer)
    : base_(std::move(base)), tokenizer_(std::move(tokenizer)) {
  check_token_base("CausalLM", base_, tokenizer_);
}

Sample CausalLM::get(int64_t index, SampleRng& rng) const {
  Sample s = token_sample("CausalLM", *base_, index, rng);
  s.input = s.input.contiguous();
  const int64_t n = s.input.shape()[0];
  const int64_t* ids = s.input.data_ptr<int64_t>();
  Tensor target = empty({n}, {.dtype = DType::i64});
  int64_t* out = target.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < n; ++i) out[i] = ids[i + 1];
  out[n - 1] = kIgnoreIndex;
  s.target = std::move(target);
  return s;
}

std::string CausalLM::describe() const {
  return fmt::format("causal LM over {}", base_->describe());
}

namespace {

// The unigram probabilities of the non-special tokens of `tokens`, indexed by id (0 for the
// special ids), and the number N of non-special ids.
std::pair<std::vector<double>, int64_t> unigram(const std::vector<int32_t>& tokens,
                                                const WordPiece& tokenizer, const char* who) {
  std::vector<double> p(static_cast<size_t>(tokenizer.vocab_size()), 0.0);
  int64_t total = 0;
  for (int32_t id : tokens) {
    KILN_CHECK(id >= 0 && id < tokenizer.vocab_size(),
               "{}: token id {} outside the vocabulary [0, {})", who, id, tokenizer.vocab_size());
    if (tokenizer.is_special(id)) continue;
    p[static_cast<size_t>(id)] += 1.0;
    ++total;
  }
  KILN_CHECK(total > 0, "{}: no non-special tokens among {}", who, tokens.size());
  for (double& x : p) x /= static_cast<double>(total);
  int64_t ordinary = 0;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id)
    ordinary += tokenizer.is_special(id) ? 0 : 1;
  return {std::move(p), ordinary};
}

}  // namespace

double unigram_entropy_bits(const std::vector<int32_t>& tokens, const WordPiece& tokenizer) {
  const auto [p, n] = unigram(tokens, tokenizer, "unigram_entropy_bits");
  double h = 0.0;
  for (double x : p)
    if (x > 0) h -= x * std::log2(x);
  return h;
}

double masked_lm_baseline_bits(const std::vector<int32_t>& tokens, const WordPiece& tokenizer,
                               const MaskedLMOptions& options) {
  const auto [p, count] = unigram(tokens, tokenizer, "masked_lm_baseline_bits");
  const auto n = static_cast<double>(count);
  const double keep = std::max(0.0, 1.0 - options.mask_token_prob - options.random_token_prob);
  double h = 0.0;
  for (double x : p)
    if (x > 0) h -= x * std::log2(x);
  if (options.random_token_prob == 0)
    return options.mask_token_prob * h;  // unchanged: answer shown
  // r N p_x: how much likelier "unchanged" than "random" makes x the original.
  const double r = keep / options.random_token_prob;
  double spread = 0.0, unchanged = 0.0;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.is_special(id)) continue;
    const double x = p[static_cast<size_t>(id)];
    spread += std::log2(1.0 + r * n * x);
    if (x > 0) unchanged += x * std::log2((r * n * x + 1.0) / (x * (r * n + 1.0)));
  }
  const double random = h + (spread - std::log2(1.0 + r * n)) / n;
  return options.mask_token_prob * h + options.random_token_prob * random + keep * unchanged;
}

}  // namespace kiln::data
