// Batches of varied sequence lengths under kiln::compile. A graph is specialized to its
// input shapes (guards, compiler/trace.h), so a compiled step would trace and compile once
// per distinct length; the text loader bounds that by padding each batch to its longest
// sequence rounded up to a multiple (LoaderOptions::pad_multiple), with a mask that keeps
// the padding out of attention and of the pooled features. These tests train a small
// transformer classifier over texts of 3 to 60 tokens: with multiples of 16 its compiled
// step makes one graph per length bucket (at most 4 for lengths up to 64), each padded
// batch's loss equals the unpadded batch's eager loss, and explain() names the shape
// guard that separates the buckets.
#include <set>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "core/ops/elementwise.h"
#include "core/ops/loss.h"
#include "core/ops/reduce.h"
#include "data/loader.h"
#include "data/text.h"
#include "data/wordpiece.h"
#include "models/attention.h"
#include "models/layers.h"
#include "testing.h"

using namespace kiln;

namespace {

// Texts of 1 to 57 words ("w3 w17 ..." from 20 words), labelled by whether word 0 appears.
data::TextTask task() {
  data::TextTask t;
  t.class_names = {"without", "with"};
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (int i = 0; i < 48; ++i) {
    // Mostly short: the longest of a batch of 4 still lands in every bucket.
    const uint64_t r = next() % 58;
    const int64_t words = 1 + static_cast<int64_t>(r * r / 58);
    std::string text;
    bool has0 = false;
    for (int64_t w = 0; w < words; ++w) {
      const uint64_t word = next() % 20;
      has0 |= word == 0;
      text += (w ? " w" : "w") + std::to_string(word);
    }
    t.texts.push_back(text);
    t.labels.push_back(has0 ? 1 : 0);
  }
  return t;
}

struct Classifier {
  nn::Embedding embedding;
  nn::TransformerEncoderLayer layer;
  nn::Linear head;
  Classifier(int64_t vocab)
      : embedding(vocab, 16),
        layer(16, 2, {.dim_feedforward = 32, .dropout = 0.0, .batch_first = true}),
        head(16, 2) {}
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all = embedding.parameters();
    for (const Tensor& p : layer.parameters()) all.push_back(p);
    for (const Tensor& p : head.parameters()) all.push_back(p);
    return all;
  }
  // The loss of a batch: ids and mask i64 [N, L] (mask 1 on tokens), labels i64 [N]; the
  // features are the mean over each sequence's tokens.
  Tensor loss(const Tensor& ids, const Tensor& mask, const Tensor& labels) {
    const Tensor h = layer.forward(embedding(ids), {}, eq(mask, 0));
    const Tensor m = mask.to(DType::f32).unsqueeze(-1);
    const Tensor pooled = sum(h * m, {1}) / sum(m, {1});
    return cross_entropy(head(pooled), labels);
  }
};

}  // namespace

TEST_CASE("varied lengths: padding to multiples bounds the graphs a compiled step makes", "[compile][text]") {
  const data::TextTask t = task();
  const auto wp = std::make_shared<const data::WordPiece>(data::train_wordpiece(t.texts, {.vocab_size = 64}));
  const auto set = std::make_shared<const data::TextClassification>(t, wp, 64);
  manual_seed(4);
  Classifier model(wp->vocab_size());
  auto step = [&model](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = model.loss(a[0], a[1], a[2]);
    loss.backward();
    return {loss.detach()};
  };
  CompiledFunction compiled = compile(step);
  data::Loader loader(set, {.batch_size = 4, .shuffle = true, .workers = 0, .seed = 2, .pad_multiple = 16});
  std::set<int64_t> lengths;
  int64_t batches = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (data::Batch& b : loader.epoch(epoch)) {
      const int64_t length = b.input.size(1);
      CHECK(length % 16 == 0);
      lengths.insert(length);
      // Eager on the batch cut to its longest sequence: the padding changes nothing.
      int64_t longest = 0;
      for (int64_t i = 0; i < b.mask.size(0); ++i) longest = std::max(longest, sum(b.mask[i]).item<int64_t>());
      for (const Tensor& p : model.parameters()) p.set_grad(Tensor());
      const double eager = model.loss(b.input.narrow(1, 0, longest), b.mask.narrow(1, 0, longest), b.target).item<double>();
      const double replayed = compiled({b.input, b.mask, b.target})[0].item<double>();
      // The same sums over the same tokens, in other orders where the lengths differ
      // (the softmax's, the pooled mean's): f32 over at most 64 keys and 16 features.
      CHECK(replayed == Approx(eager).epsilon(1e-5));
      ++batches;
    }
  }
  CHECK(batches == 24);
  INFO("bucket lengths " << lengths.size());
  CHECK(lengths.size() >= 3);  // the texts' lengths spread over most of the 4 buckets
  CHECK(lengths.size() <= 4);
  CHECK(compiled.cache_size() == static_cast<int64_t>(lengths.size()));
  CHECK(compiled.recompiles() == static_cast<int64_t>(lengths.size()) - 1);
  CHECK(compiled.last_recompile_reason().find("shape changed") != std::string::npos);

  // Without buckets (every batch padded to the longest sequence exactly) the same epochs
  // would compile once per distinct longest length: 11 graphs here against 4.
  data::Loader full(set, {.batch_size = 4, .shuffle = true, .workers = 0, .seed = 2, .pad_multiple = 1});
  std::set<int64_t> exact;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (data::Batch& b : full.epoch(epoch)) exact.insert(b.input.size(1));
  INFO("exact lengths " << exact.size());
  CHECK(exact.size() > 2 * lengths.size());

  // explain() of one bucket's step shows the guard on the ids' shape.
  data::Batch first = *loader.epoch(0).begin();
  const std::string report = explain(step, {first.input, first.mask, first.target});
  INFO(report);
  CHECK(report.find("[4," + std::to_string(first.input.size(1)) + "]") != std::string::npos);
}
