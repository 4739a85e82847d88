// Text data sets through the loader: packing into blocks, classification samples cut to a
// length, padding and masks, batches padded to a bucket multiple (a bounded set of
// lengths), masked-LM proportions within binomial bounds, reproducibility per sample.
#include <cmath>
#include <set>

#include "data/loader.h"
#include "data/text.h"
#include "testing.h"

using namespace kiln;
using data::Loader;
using data::WordPiece;

namespace {

std::shared_ptr<const WordPiece> hand_tokenizer() {
  return std::make_shared<const WordPiece>(std::vector<std::string>{
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",  "quick", "fox", "jump",
      "##s",   "brown", "dog",   "a",     "lazy",   "over", ".",     "red", "cat",
      "sat",   "on",    "mat",   "and",   "ran",    "far",  "away"});
}

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  std::vector<int64_t> out;
  for (int64_t c = 0; c < t.shape()[1]; ++c)
    out.push_back(static_cast<int64_t>(testing::at(t, {r, c})));
  return out;
}

std::vector<int64_t> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

TEST_CASE("PackedText: documents joined by [SEP], cut into [CLS]-led blocks", "[text]") {
  const auto wp = hand_tokenizer();
  // Stream: the fox [SEP] quick fox jump ##s [SEP] [SEP] = 9 tokens; blocks of 4 after [CLS].
  const auto text = std::make_shared<const data::PackedText>(
      std::vector<std::string>{"The fox", "quick fox jumps", ""}, wp, 5, "tiny");
  REQUIRE(text->stream().size() == 9);
  REQUIRE(text->size() == 3);
  CHECK(text->sample_shape() == std::vector<int64_t>{5});
  CHECK(text->padding_id() == 0);
  CHECK(text->num_classes() == 25);
  CHECK(text->describe() == "tiny: 3 blocks of 5 tokens (3 documents, 9 tokens with their [SEP]s, vocabulary 25)");
  data::SampleRng rng(0, 0, 0);
  CHECK(values(text->get(0, rng).input) == std::vector<int64_t>{2, 5, 7, 3, 6});
  CHECK(values(text->get(1, rng).input) == std::vector<int64_t>{2, 7, 8, 9, 3});
  CHECK(values(text->get(2, rng).input) == std::vector<int64_t>{2, 3});
  CHECK_THROWS_WITH(text->get(3, rng), Catch::Contains("sample 3 outside [0, 3)"));

  // The loader pads the short last block and masks the padding.
  Loader loader(text, {.batch_size = 3});
  int64_t batches = 0;
  for (data::Batch& b : loader.epoch(0)) {
    ++batches;
    REQUIRE(b.input.dtype() == DType::i64);
    REQUIRE(b.input.shape() == Shape{3, 5});
    CHECK(row(b.input, 2) == std::vector<int64_t>{2, 3, 0, 0, 0});
    CHECK(row(b.mask, 0) == std::vector<int64_t>{1, 1, 1, 1, 1});
    CHECK(row(b.mask, 2) == std::vector<int64_t>{1, 1, 0, 0, 0});
    CHECK(b.target.shape() == Shape{3});
  }
  CHECK(batches == 1);

  CHECK_THROWS_WITH(data::PackedText({"a"}, wp, 1),
                    Catch::Contains("seq_len 1 must be at least 2"));
  CHECK_THROWS_WITH(data::PackedText({}, wp, 8), Catch::Contains("no documents"));
  CHECK_THROWS_WITH(data::PackedText({"a"}, nullptr, 8), Catch::Contains("tokenizer is null"));
}

TEST_CASE("TextClassification: [CLS] text [SEP] cut to max_length, labels kept", "[text]") {
  const auto wp = hand_tokenizer();
  data::TextTask task{{"the fox", "the quick brown fox jumps over the lazy dog", "cat"},
                      {1, 0, 2},
                      {"a", "b", "c"}};
  const data::TextClassification set(task, wp, 6, "tiny task");
  REQUIRE(set.size() == 3);
  CHECK(set.num_classes() == 3);
  CHECK(set.truncated() == 1);
  data::SampleRng rng(0, 0, 0);
  CHECK(values(set.get(0, rng).input) == std::vector<int64_t>{2, 5, 7, 3});
  CHECK(set.get(0, rng).label == 1);
  CHECK(values(set.get(1, rng).input) ==
        std::vector<int64_t>{2, 5, 6, 10, 7, 3});  // cut, [SEP] kept
  CHECK(values(set.get(2, rng).input) == std::vector<int64_t>{2, 17, 3});
  CHECK(set.describe() == "tiny task: 3 texts, 3 classes, at most 6 tokens (1 cut)");

  task.labels[2] = 3;
  CHECK_THROWS_WITH(data::TextClassification(task, wp, 6),
                    Catch::Contains("text 2 has label 3, outside [0, 3)"));
  task.labels.pop_back();
  CHECK_THROWS_WITH(data::TextClassification(task, wp, 6), Catch::Contains("3 texts but 2 labels"));
}

TEST_CASE("the loader pads token batches to a bucket multiple: a bounded set of lengths",
          "[text]") {
  const auto wp = hand_tokenizer();
  // Texts of 1 to 30 words: [CLS] + n + [SEP] = n + 2 tokens, cut at 24.
  const std::vector<std::string> words{"the",  "quick", "brown", "fox",
                                       "over", "a",     "lazy",  "dog"};  // one token each
  data::TextTask task;
  task.class_names = {"short", "long"};
  for (int n = 1; n <= 30; ++n) {
    std::string text;
    for (int w = 0; w < n; ++w) text += words[static_cast<size_t>(w) % words.size()] + " ";
    task.texts.push_back(text);
    task.labels.push_back(n > 10 ? 1 : 0);
  }
  const auto set = std::make_shared<const data::TextClassification>(task, wp, 24);
  CHECK(set->truncated() == 30 - 22);  // n + 2 > 24 for n = 23..30

  SECTION("full length") {
    Loader loader(set, {.batch_size = 4, .shuffle = true, .seed = 3});
    for (data::Batch& b : loader.epoch(0)) CHECK(b.input.shape()[1] == 24);
  }
  SECTION("bucket multiple 8: the longest of the batch rounded up") {
    Loader loader(set, {.batch_size = 4, .shuffle = true, .seed = 3, .pad_multiple = 8});
    std::set<int64_t> lengths;
    for (data::Batch& b : loader.epoch(0)) {
      int64_t longest = 0;
      for (int64_t r = 0; r < b.size(); ++r) {
        const std::vector<int64_t> m = row(b.mask, r);
        const int64_t len = std::count(m.begin(), m.end(), 1);
        CHECK(len ==
              std::min<int64_t>(b.indices[static_cast<size_t>(r)] + 3, 24));  // text i: i + 1 words
        const std::vector<int64_t> ids = row(b.input, r);
        CHECK(ids[static_cast<size_t>(len - 1)] == wp->sep_id());
        for (size_t c = static_cast<size_t>(len); c < ids.size(); ++c)
          CHECK(ids[c] == wp->pad_id());
        longest = std::max(longest, len);
      }
      const int64_t length = b.input.shape()[1];
      CHECK(length % 8 == 0);
      CHECK(length >= longest);
      CHECK(length < longest + 8);
      CHECK(b.mask.shape() == b.input.shape());
      CHECK(b.target.shape() == Shape{b.size()});
      lengths.insert(length);
    }
    CHECK(lengths.size() <= 3);  // 8, 16 or 24: ceil(24 / 8)
    CHECK(lengths.size() >= 2);  // this shuffle does vary them
  }
  SECTION("a multiple that does not divide the full length stops at it") {
    Loader loader(set, {.batch_size = 30, .pad_multiple = 10});
    for (data::Batch& b : loader.epoch(0)) CHECK(b.input.shape() == Shape{30, 24});
  }
  CHECK_THROWS_WITH(Loader(set, {.pad_multiple = -1}), Catch::Contains("pad_multiple -1"));
}

TEST_CASE("MaskedLM: 15% of the tokens, 80/10/10, within binomial bounds", "[text][mlm]") {
  const auto wp = hand_tokenizer();
  std::vector<std::string> docs;
  for (int i = 0; i < 1000; ++i)
    docs.push_back(i % 2 ? "the quick brown fox jumps over the lazy dog."
                         : "a red cat sat on the mat and ran far away");
  const auto text = std::make_shared<const data::PackedText>(docs, wp, 64);
  const auto mlm = std::make_shared<const data::MaskedLM>(text, wp);
  CHECK(mlm->num_classes() == wp->vocab_size());
  CHECK(mlm->describe() ==
        "masked LM (15% of tokens: 80% [MASK], 10% random) over " + text->describe());
  Loader loader(mlm, {.batch_size = 16, .seed = 11});

  int64_t ordinary = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  for (data::Batch& b : loader.epoch(0)) {
    REQUIRE(b.target.shape() == b.input.shape());
    for (int64_t r = 0; r < b.size(); ++r) {
      const std::vector<int64_t> in = row(b.input, r), target = row(b.target, r),
                                 mask = row(b.mask, r);
      data::SampleRng unused(0, 0, 0);  // PackedText draws nothing
      const std::vector<int64_t> orig =
          values(text->get(b.indices[static_cast<size_t>(r)], unused).input);
      for (size_t c = 0; c < in.size(); ++c) {
        if (mask[c] == 0) {
          CHECK(target[c] == data::kIgnoreIndex);
          CHECK(in[c] == wp->pad_id());
          continue;
        }
        if (wp->is_special(orig[c])) {
          CHECK(target[c] == data::kIgnoreIndex);  // [CLS] and [SEP] are never chosen
          CHECK(in[c] == orig[c]);
          continue;
        }
        ++ordinary;
        if (target[c] == data::kIgnoreIndex) {
          CHECK(in[c] == orig[c]);
          continue;
        }
        CHECK(target[c] == orig[c]);
        ++chosen;
        if (in[c] == wp->mask_id())
          ++masked;
        else if (in[c] == orig[c])
          ++kept;
        else {
          ++random;
          CHECK_FALSE(wp->is_special(in[c]));
        }
      }
    }
  }
  // Each count is binomial; five standard deviations allowed (a false failure has odds
  // below 1e-6 per check). A random replacement draws the original token itself with
  // probability 1 / 20 (20 non-special tokens), and then counts as kept.
  const auto within = [](int64_t k, int64_t n, double p) {
    INFO(k << " of " << n << ", p = " << p);
    CHECK(std::abs(static_cast<double>(k) - p * static_cast<double>(n)) <=
          5 * std::sqrt(static_cast<double>(n) * p * (1 - p)));
  };
  REQUIRE(ordinary == 1000 * 11);  // eleven non-special tokens a document
  within(chosen, ordinary, 0.15);
  within(masked, chosen, 0.8);
  within(random, chosen, 0.1 * 19.0 / 20.0);
  within(kept, chosen, 0.1 + 0.1 / 20.0);
}

TEST_CASE("MaskedLM: each sample's masking is reproducible, new each epoch", "[text][mlm]") {
  const auto wp = hand_tokenizer();
  std::vector<std::string> docs(50, "the quick brown fox jumps over the lazy dog");
  const auto text = std::make_shared<const data::PackedText>(docs, wp, 32);
  const auto mlm = std::make_shared<const data::MaskedLM>(text, wp);
  const auto collect = [&](int64_t workers, int64_t epoch, uint64_t seed) {
    Loader loader(mlm, {.batch_size = 5, .shuffle = true, .workers = workers, .seed = seed});
    std::vector<std::vector<int64_t>> out;
    for (data::Batch& b : loader.epoch(epoch)) {
      out.push_back(values(b.input));
      out.push_back(values(b.target));
    }
    return out;
  };
  const auto first = collect(0, 0, 1);
  CHECK(first == collect(0, 0, 1));
  CHECK(first == collect(2, 0, 1));  // any worker count
  CHECK(first != collect(0, 1, 1));  // another epoch masks anew
  CHECK(first != collect(0, 0, 2));

  CHECK_THROWS_WITH(data::MaskedLM(text, wp, {.mask_prob = 1.5}), Catch::Contains("mask_prob 1.5"));
  CHECK_THROWS_WITH(data::MaskedLM(text, wp, {.mask_token_prob = 0.8, .random_token_prob = 0.3}),
                    Catch::Contains("summing to at most 1"));
}

TEST_CASE("unigram entropy of a token stream, special tokens left out", "[text]") {
  const auto wp = hand_tokenizer();
  // the x2, fox, jump: p = 1/2, 1/4, 1/4 -> 1.5 bits; [CLS] and [SEP] ignored.
  CHECK(data::unigram_entropy_bits({2, 5, 5, 7, 8, 3, 3}, *wp) == Approx(1.5).epsilon(1e-12));
  CHECK(data::unigram_entropy_bits({5, 5, 5}, *wp) == 0.0);
  CHECK_THROWS_WITH(data::unigram_entropy_bits({2, 3}, *wp),
                    Catch::Contains("no non-special tokens"));
}

// The closed form against the definition: the expected -log2 of the posterior of the
// original token o given the token shown, summed over every (o, shown) pair.
TEST_CASE("the masked-LM baseline of a model without context, against brute force", "[text][mlm]") {
  const auto wp = hand_tokenizer();
  const std::vector<int32_t> tokens{2, 5, 5, 5, 7, 7, 8, 9, 10, 10, 10, 10, 3, 24};
  std::vector<double> p(25, 0.0);
  double total = 0;
  for (int32_t id : tokens)
    if (!wp->is_special(id)) p[static_cast<size_t>(id)] += 1, total += 1;
  for (double& x : p) x /= total;
  const double n = 20;  // non-special ids 5..24
  const double h = data::unigram_entropy_bits(tokens, *wp);
  for (const data::MaskedLMOptions options :
       {data::MaskedLMOptions{},
        data::MaskedLMOptions{.mask_token_prob = 0.7, .random_token_prob = 0.2},
        data::MaskedLMOptions{.mask_token_prob = 0.9, .random_token_prob = 0.0}}) {
    INFO("mask " << options.mask_token_prob << ", random " << options.random_token_prob);
    const double keep = 1 - options.mask_token_prob - options.random_token_prob;
    double expected = 0;
    for (int o = 5; o < 25; ++o) {
      const double po = p[static_cast<size_t>(o)];
      if (po == 0) continue;
      expected += po * options.mask_token_prob * -std::log2(po);  // [MASK] shown: the prior
      for (int x = 5; x < 25; ++x) {
        // Shown x with probability keep 1[o = x] + random / n; the posterior of o given x.
        const double shown = (o == x ? keep : 0.0) + options.random_token_prob / n;
        if (shown == 0) continue;
        double z = 0;
        for (int o2 = 5; o2 < 25; ++o2)
          z +=
              p[static_cast<size_t>(o2)] * ((o2 == x ? keep : 0.0) + options.random_token_prob / n);
        expected += po * shown * -std::log2(po * shown / z);
      }
    }
    const double baseline = data::masked_lm_baseline_bits(tokens, *wp, options);
    CHECK(baseline == Approx(expected).epsilon(1e-12));
    CHECK(baseline < h);
  }
  // Everything masked: the baseline is the entropy itself.
  CHECK(data::masked_lm_baseline_bits(tokens, *wp,
                                      {.mask_token_prob = 1.0, .random_token_prob = 0.0}) ==
        Approx(h).epsilon(1e-12));
}

TEST_CASE("CausalLM: the next token as each position's target", "[text]") {
  const auto wp = hand_tokenizer();
  const auto text = std::make_shared<const data::PackedText>(
      std::vector<std::string>{"The fox", "quick fox jumps"}, wp, 5);
  const auto lm = std::make_shared<const data::CausalLM>(text, wp);
  CHECK(lm->num_classes() == 25);
  data::Loader loader(lm, {.batch_size = 2});
  int64_t batches = 0;
  for (data::Batch& b : loader.epoch(0)) {
    ++batches;
    // Stream: the fox [SEP] quick fox jump ##s [SEP]; blocks [CLS] the fox [SEP] quick and
    // [CLS] fox jump ##s [SEP].
    CHECK(row(b.input, 0) == std::vector<int64_t>{2, 5, 7, 3, 6});
    CHECK(row(b.target, 0) == std::vector<int64_t>{5, 7, 3, 6, data::kIgnoreIndex});
    CHECK(row(b.target, 1) == std::vector<int64_t>{7, 8, 9, 3, data::kIgnoreIndex});
  }
  CHECK(batches == 1);
  const data::TextTask task{{"fox"}, {0}, {"a"}};
  const auto other = std::make_shared<const WordPiece>(
      std::vector<std::string>{"[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"});
  CHECK_THROWS_WITH(
      data::CausalLM(std::make_shared<const data::TextClassification>(task, wp, 8), other),
      Catch::Contains("pads with id 0, but the tokenizer's [PAD] is 1"));
  CHECK_THROWS_WITH(data::CausalLM(nullptr, wp), Catch::Contains("null"));
}

namespace {

// A token-sequence data set that returns one kind of wrong sample, for the loader's checks.
class WrongTokens : public data::Dataset {
 public:
  enum class Kind {
    floats,
    empty,
    too_long,
    target_out_of_range,
    mixed_targets,
    label_out_of_range
  };
  explicit WrongTokens(Kind kind) : kind_(kind) {}
  int64_t size() const override { return 2; }
  int64_t num_classes() const override { return 5; }
  std::vector<int64_t> sample_shape() const override { return {4}; }
  std::optional<int64_t> padding_id() const override { return 0; }
  data::Sample get(int64_t index, data::SampleRng&) const override {
    data::Sample s{from_vector<int64_t>({2, 3}), 0};
    switch (kind_) {
      case Kind::floats:
        s.input = from_vector<float>({2, 3});
        break;
      case Kind::empty:
        s.input = empty({0}, {.dtype = DType::i64});
        break;
      case Kind::too_long:
        s.input = from_vector<int64_t>({2, 1, 1, 1, 3});
        break;
      case Kind::target_out_of_range:
        s.target = from_vector<int64_t>({-100, 5});
        break;
      case Kind::mixed_targets:
        if (index == 1) s.target = from_vector<int64_t>({-100, 1});
        break;
      case Kind::label_out_of_range:
        s.label = 7;
        break;
    }
    return s;
  }
  std::string describe() const override { return "wrong tokens"; }

 private:
  Kind kind_;
};

}  // namespace

TEST_CASE("the loader refuses token samples of the wrong kind, naming the sample", "[text]") {
  using Kind = WrongTokens::Kind;
  const auto refuse = [](Kind kind, const std::string& message) {
    Loader loader(std::make_shared<WrongTokens>(kind), {.batch_size = 2});
    auto epoch = loader.epoch(0);
    CHECK_THROWS_WITH(epoch.begin(), Catch::Contains(message));
  };
  refuse(Kind::floats,
         "sample 0 is f32[2] cpu, but a token-sequence data set's samples are i64[length]");
  refuse(Kind::empty, "sample 0 is i64[0] cpu");
  refuse(Kind::too_long, "1 <= length <= 4");
  refuse(Kind::target_out_of_range, "sample 0 has target 5 at token 1, neither -100 nor in [0, 5)");
  refuse(Kind::mixed_targets, "sample 1 has per-token targets but sample 0 lacks");
  refuse(Kind::label_out_of_range, "sample 0 has label 7, outside [0, 5)");
}

TEST_CASE("MaskedLM over single glosses: per-token targets in bucketed batches", "[text][mlm]") {
  const auto wp = hand_tokenizer();
  data::TextTask task{
      {"the fox", "the quick brown fox jumps over the lazy dog", "a red cat sat on the mat"},
      {0, 0, 0},
      {"all"}};
  const auto glosses = std::make_shared<const data::TextClassification>(task, wp, 32);
  const auto mlm =
      std::make_shared<const data::MaskedLM>(glosses, wp, data::MaskedLMOptions{.mask_prob = 1.0});
  data::Loader loader(mlm, {.batch_size = 3, .pad_multiple = 8});
  for (data::Batch& b : loader.epoch(0)) {
    REQUIRE(b.input.shape() == Shape{3, 16});  // the longest, 12 tokens, rounded up to 16
    REQUIRE(b.target.shape() == Shape{3, 16});
    // mask_prob 1: every non-special token is a target; [CLS], [SEP] and padding are not.
    CHECK(row(b.target, 0) == std::vector<int64_t>{-100, 5, 7, -100, -100, -100, -100, -100, -100,
                                                   -100, -100, -100, -100, -100, -100, -100});
    CHECK(row(b.mask, 0) == std::vector<int64_t>{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  }
}
