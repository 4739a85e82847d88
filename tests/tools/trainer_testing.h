#pragma once
// What the kiln-train engine's tests share: a scratch folder, the small run most of them
// train, and exact comparisons of two runs' results.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/disk_cache.h"
#include "core/generator.h"
#include "core/ops/factory.h"
#include "data/dataset.h"
#include "testing.h"
#include "tools/trainer.h"

namespace kiln::testing {

// A fresh private folder under $TMPDIR, removed with everything in it.
class TempDir : public disk_cache::ScratchDir {
 public:
  TempDir() : ScratchDir("test") {}
};

// A ConvNet on 40 synthetic 12x12 images of 4 classes: 5 steps of batch 8 per epoch, each in
// two micro-batches of 4, for 2 epochs.
inline train::Config small_cnn() {
  train::Config c;
  c.data = "synthetic";
  c.synthetic_size = 40;
  c.synthetic_classes = 4;
  c.image_size = 12;
  c.arch = "cnn";
  c.batch = 8;
  c.micro_batch = 4;
  c.epochs = 2;
  c.workers = 1;
  c.seed = 3;
  c.lr = 0.05;
  c.quiet = true;
  return c;
}

// bert-tiny learning masked LM on the test copy of WordNet: blocks of 16 tokens, 4 steps
// of batch 4 in micro-batches of 2.
inline train::Config small_bert() {
  train::Config c;
  c.arch = "bert-tiny";
  c.data = (std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/wordnet").string();
  c.seq_len = 16;
  c.vocab_size = 200;
  c.batch = 4;
  c.micro_batch = 2;
  c.steps = 4;
  c.epochs = 0;
  c.workers = 1;
  c.seed = 11;
  c.optimizer = "adamw";
  c.lr = 1e-3;
  c.lr_schedule = "linear";
  c.clip_grad_norm = 1.0;
  c.quiet = true;
  return c;
}

// A batch of token sequences for the text models' steps: ids [n, length] in [5, vocab)
// (past the special ids) drawn from `seed`, a mask with padding at the end of the rows i
// with i % 3 > 0 (i % 3 positions), and per-token targets: the id where
// predicted(i, j) holds, except in row 1, which predicts nothing; kIgnoreIndex elsewhere
// and on padding.
struct TokenBatch {
  Tensor ids, mask, targets;
};
template <class Predicted>
TokenBatch token_batch(int64_t n, int64_t length, int64_t vocab, uint64_t seed, Predicted predicted) {
  Generator gen(seed);
  const Tensor ids = randint(5, vocab, {n, length}, {}, &gen);
  Tensor mask = ones({n, length}, {.dtype = DType::i64});
  Tensor targets = full({n, length}, data::kIgnoreIndex, {.dtype = DType::i64});
  int64_t* m = mask.data_ptr<int64_t>();
  int64_t* t = targets.data_ptr<int64_t>();
  const int64_t* x = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t used = length - (i % 3);
    for (int64_t j = used; j < length; ++j) m[i * length + j] = 0;
    for (int64_t j = 0; j < used; ++j)
      if (i != 1 && predicted(i, j)) t[i * length + j] = x[i * length + j];
  }
  return {ids, mask, targets};
}

// train::run with its printing discarded.
inline train::Result run(const train::Config& c) {
  std::ostringstream out;
  return train::run(c, out);
}

// Same names, dtypes, shapes and bytes.
inline void require_bitwise_equal(const StateDict& actual, const StateDict& expected) {
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, e] : expected) {
    INFO("tensor " << name);
    auto it = actual.find(name);
    REQUIRE(it != actual.end());
    const Tensor a = it->second.contiguous(), x = e.contiguous();
    REQUIRE(a.dtype() == x.dtype());
    REQUIRE(a.shape() == x.shape());
    CHECK(std::memcmp(a.data_ptr(), x.data_ptr(), a.numel() * a.itemsize()) == 0);
  }
}

// Step losses and epoch records, exactly, but for images/s (a timing).
inline void require_same_history(const train::Result& actual, const train::Result& expected) {
  CHECK(actual.step_losses == expected.step_losses);
  REQUIRE(actual.epochs.size() == expected.epochs.size());
  for (size_t i = 0; i < expected.epochs.size(); ++i) {
    INFO("epoch record " << i);
    const train::EpochRecord &a = actual.epochs[i], &e = expected.epochs[i];
    CHECK(a.epoch == e.epoch);
    CHECK(a.train_loss == e.train_loss);
    CHECK(a.train_accuracy == e.train_accuracy);
    CHECK(a.val_loss == e.val_loss);
    CHECK(a.val_accuracy == e.val_accuracy);
  }
}

// The whole file as text ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace kiln::testing
