// kiln-train's transformers: masked-LM and causal-LM pretraining and classification
// fine-tuning on WordNet's glosses (tests/data/wordnet, a few synsets of each part of
// speech) or a text file, the per-token weighting of accumulated micro-steps, compiled
// against eager, resume, --init and the settings' errors.
#include <fstream>

#include "autograd/node.h"
#include "data/dataset.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "optim/sgd.h"
#include "tolerance.h"
#include "tools/checkpoint.h"
#include "tools/trainer_testing.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::Contains;

namespace {

// Row 1 predicts nothing; the other rows the tokens at (i + 2j) % 5 == 0.
TokenBatch token_batch(int64_t n, int64_t length, int64_t vocab, uint64_t seed) {
  return testing::token_batch(n, length, vocab, seed, [](int64_t i, int64_t j) { return (i + 2 * j) % 5 == 0; });
}

}  // namespace

TEST_CASE("trainer text: a masked-LM step is the mean over the global batch's predicted tokens however it is split",
          "[trainer][text]") {
  // f64 and no dropout: the split changes only the order of sums. The step's loss must be
  // the cross entropy averaged over every predicted token of the batch (not the mean of
  // the micro-batches' means), and the weights after one SGD step the same.
  models::BertConfig config = models::BertConfig::tiny(40);
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0;
  const TokenBatch b = token_batch(6, 9, 40, 3);
  auto step = [&](int64_t micro_batch) {
    manual_seed(5);
    models::BertForMaskedLM model(config);
    model.to(DType::f64);
    optim::SGD sgd(model.parameters(), {.lr = 0.5});
    Tensor expected;
    {
      NoGradGuard no_grad;
      expected = models::masked_lm_loss(model.forward(b.ids, b.mask), b.targets);
    }
    const optim::Accumulation accumulation({.batch = 6, .micro_batch = micro_batch});
    const train::StepStats stats =
        train::train_step(model, sgd, accumulation, b.ids, b.targets, 0.0, {}, nullptr, b.mask);
    CHECK(stats.samples == 6);
    CHECK(stats.predicted == sum(ne(b.targets, data::kIgnoreIndex)).item<int64_t>());
    CHECK(stats.loss == Approx(expected.item<double>()).epsilon(1e-12));
    return std::make_pair(stats, model.state_dict());
  };
  const auto [whole, whole_model] = step(6);
  for (int64_t micro : {1, 2, 4}) {
    INFO("micro-batch " << micro);  // 1: row 1 alone predicts nothing
    const auto [split, split_model] = step(micro);
    CHECK(split.loss == Approx(whole.loss).epsilon(1e-12));
    CHECK(split.correct == whole.correct);
    CHECK(relative_difference(split_model, whole_model) <= 1e-12);
  }
}

TEST_CASE("trainer text: a causal-LM step weighs tokens as one batch and a batch with nothing to predict is finite",
          "[trainer][text]") {
  models::GPT2Config config = models::GPT2Config::tiny(40);
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0;
  TokenBatch b = token_batch(4, 8, 40, 9);
  manual_seed(2);
  models::GPT2LMHeadModel model(config);
  model.to(DType::f64);
  optim::SGD sgd(model.parameters(), {.lr = 0.1});
  const optim::Accumulation accumulation({.batch = 4, .micro_batch = 3});
  const Tensor nothing = full({4, 8}, data::kIgnoreIndex, {.dtype = DType::i64});
  const train::StepStats empty = train::train_step(model, sgd, accumulation, b.ids, nothing, 0.0, {}, nullptr, b.mask);
  CHECK(empty.predicted == 0);
  CHECK(empty.loss == 0);
  for (const Tensor& p : model.parameters()) CHECK(std::isfinite(sum(abs(p)).item<double>()));
  Tensor expected;
  {
    NoGradGuard no_grad;
    const Tensor logits = model.forward(b.ids, b.mask);
    expected = cross_entropy(logits.reshape({-1, 40}), b.targets.reshape({-1}));
  }
  const train::StepStats stats = train::train_step(model, sgd, accumulation, b.ids, b.targets, 0.0, {}, nullptr, b.mask);
  CHECK(stats.loss == Approx(expected.item<double>()).epsilon(1e-12));
}

TEST_CASE("trainer text: bert-tiny pretrains, resumes bitwise and fine-tunes a classifier from its checkpoint",
          "[trainer][text]") {
  TempDir dir;
  train::Config c = small_bert();
  c.checkpoint_dir = dir.path() / "mlm";
  c.quiet = false;
  std::ostringstream log;
  const train::Result whole = train::run(c, log);
  REQUIRE(whole.steps == 4);
  CHECK(log.str().find("bert-tiny (masked LM)") != std::string::npos);
  CHECK(log.str().find("WordPiece tokens, trained on the training text") != std::string::npos);
  for (double loss : whole.step_losses) CHECK(std::isfinite(loss));
  REQUIRE(std::filesystem::is_regular_file(c.checkpoint_dir / "vocab.txt"));
  REQUIRE(whole.epochs.size() >= 1);
  CHECK(whole.epochs.back().val_loss > 0);  // the held-out glosses

  // Interrupted after 2 steps and resumed: bitwise the same weights (dropout's stream and
  // the masking of each sample follow from the seed, the step and the sample).
  train::Config first = c;
  first.checkpoint_dir = dir.path() / "halves";
  first.stop_after_steps = 2;
  REQUIRE(run(first).interrupted);
  train::Config second = first;
  second.stop_after_steps = 0;
  second.resume = true;
  const train::Result resumed = run(second);
  CHECK(resumed.step_losses == whole.step_losses);
  require_bitwise_equal(resumed.model, whole.model);

  // Fine-tuning: the encoder starts from the checkpoint (with lr 0 it stays there), the
  // pooler and the classifier start fresh, and the vocabulary is the checkpoint's.
  train::Config tune = small_bert();
  tune.task = "classify";
  tune.init = c.checkpoint_dir;
  tune.lr = 0;
  tune.steps = 2;
  tune.vocab_size = 50;  // not used: the checkpoint's vocabulary is read
  tune.quiet = false;
  std::ostringstream tune_log;
  const train::Result tuned = train::run(tune, tune_log);
  CHECK(tune_log.str().find("classifier of 45 classes") != std::string::npos);
  CHECK(tune_log.str().find("init: ") != std::string::npos);
  CHECK(tune_log.str().find("initialized fresh: bert.pooler.dense.bias, bert.pooler.dense.weight, classifier.bias, "
                            "classifier.weight") != std::string::npos);
  CHECK(tune_log.str().find((c.checkpoint_dir / "vocab.txt").string()) != std::string::npos);
  int64_t compared = 0;
  for (const auto& [name, t] : tuned.model) {
    if (!name.starts_with("bert.embeddings") && !name.starts_with("bert.encoder")) continue;
    INFO(name);
    REQUIRE(whole.model.contains(name));
    CHECK(same_bits(t, whole.model.at(name)));
    ++compared;
  }
  CHECK(compared > 10);
  REQUIRE(tuned.epochs.size() >= 1);
  CHECK(tuned.epochs.back().val_accuracy >= 0);

  // --init naming a step folder or its weights file loads the same.
  const std::vector<std::filesystem::path> folders = train::checkpoint_folders(c.checkpoint_dir);
  REQUIRE(!folders.empty());
  tune.init = folders.back() / "model.safetensors";
  CHECK(same_bits(run(tune).model.at("bert.encoder.layer.0.output.dense.weight"),
                  tuned.model.at("bert.encoder.layer.0.output.dense.weight")));
}

TEST_CASE("trainer text: --compile trains the transformers like eager", "[trainer][text]") {
  // Dropout draws from the same Philox stream in both; the kernels sum in other orders.
  // The longest sums are the 512-wide feed-forward layers' (the vocabulary has under 200
  // tokens, a block 16). AdamW's update m / sqrt(v) is invariant to the gradients' scale,
  // so their relative rounding moves each update by as much relative, and the 4 updates
  // (lr 1e-3 each) are a fraction of the weights (0.02 wide): the bound of those sums
  // covers losses and weights alike.
  constexpr double kTolerance = summation_bound(512);
  for (const char* arch : {"bert-tiny", "gpt2-tiny"}) {
    INFO(arch);
    train::Config c = small_bert();
    c.arch = arch;
    const train::Result eager = run(c);
    c.compile = true;
    const train::Result compiled = run(c);
    REQUIRE(compiled.step_losses.size() == eager.step_losses.size());
    for (size_t i = 0; i < eager.step_losses.size(); ++i)
      CHECK(compiled.step_losses[i] == Approx(eager.step_losses[i]).epsilon(kTolerance));
    CHECK(relative_difference(compiled.model, eager.model) <= kTolerance);
    REQUIRE(compiled.epochs.size() == eager.epochs.size());
    CHECK(compiled.epochs.back().val_loss == Approx(eager.epochs.back().val_loss).epsilon(kTolerance));
  }
}

TEST_CASE("trainer text: gpt2 learns the next token of a text file's documents", "[trainer][text]") {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "corpus.txt";
  {
    std::ofstream out(file);
    for (int d = 0; d < 30; ++d)
      out << "the cat sat on the mat number " << d << ".\nit was a good mat.\n\n   \n";
  }
  train::Config c = small_bert();
  c.arch = "gpt2-tiny";
  c.data = file.string();
  c.seq_len = 12;
  c.steps = 12;
  c.lr = 3e-3;
  c.micro_batch = 0;
  c.quiet = false;
  std::ostringstream log;
  const train::Result r = train::run(c, log);
  CHECK(log.str().find("gpt2-tiny (causal LM) on") != std::string::npos);
  CHECK(log.str().find("corpus.txt") != std::string::npos);
  REQUIRE(r.step_losses.size() == 12);
  // A text this repetitive is learnt fast: the loss falls by half in 12 steps.
  CHECK(r.step_losses.back() < 0.5 * r.step_losses.front());
  REQUIRE(!r.epochs.empty());
  CHECK(r.epochs.back().val_loss > 0);  // every tenth document held out
}

TEST_CASE("trainer text: the transformers' settings are checked and their defaults are the usual recipe",
          "[trainer][text][train_args]") {
  const auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "kiln-train");
    return train::parse_args(static_cast<int>(args.size()), args.data());
  };
  const train::Config d = parse({"--arch", "bert-mini"});
  CHECK(d.data == "wordnet");
  CHECK(train::task_of(d) == "mlm");
  CHECK(d.optimizer == "adamw");
  CHECK(d.lr == 5e-4);
  CHECK(d.lr_schedule == "linear");
  CHECK(d.weight_decay == 0.01);
  CHECK(d.weight_decay_scope == "no-norm-bias");
  CHECK(d.clip_grad_norm == 1.0);
  const train::Config given = parse({"--arch", "gpt2-mini", "--lr", "0.01", "--optimizer", "sgd", "--seq-len", "64"});
  CHECK(train::task_of(given) == "clm");
  CHECK(given.lr == 0.01);
  CHECK(given.optimizer == "sgd");
  CHECK(given.seq_len == 64);
  CHECK(parse({"--arch", "resnet18"}).optimizer == "sgd");  // the image models keep theirs

  const auto fails = [&](std::vector<const char*> args, const std::string& message) {
    INFO(message);
    REQUIRE_THROWS_WITH(parse(args), Contains(message));
  };
  fails({"--arch", "bert-mini", "--task", "clm"}, "BERT learns mlm (masked LM) or classify");
  fails({"--arch", "gpt2-small", "--task", "classify"}, "GPT-2 learns clm");
  fails({"--arch", "bert-huge"}, "--arch bert-huge: expected");
  fails({"--arch", "bert-mini", "--task", "translate"}, "--task translate: expected mlm, clm or classify");
  fails({"--arch", "resnet18", "--task", "mlm"}, "the image models classify");
  fails({"--arch", "bert-mini", "--data", "shapes"}, "trains on text");
  fails({"--arch", "bert-mini", "--seq-len", "1"}, "--seq-len 1 must be between 2 and");
  fails({"--arch", "bert-mini", "--vocab-size", "3"}, "--vocab-size 3 must be between 8 and");
  fails({"--arch", "bert-mini", "--mlm-probability", "0"}, "--mlm-probability 0 must be in (0, 1]");
  fails({"--arch", "bert-mini", "--image-size", "32"}, "--image-size, --pad, --channels-last");
  fails({"--arch", "bert-mini", "--micro-batch", "auto"}, "give --arch bert-mini a --micro-batch N");
  fails({"--arch", "cnn", "--init", "x.safetensors"}, "--init and --vocab are for the transformers");

  TempDir dir;
  train::Config c = small_bert();
  c.init = dir.path() / "missing";
  REQUIRE_THROWS_WITH(run(c), Contains("--init " + c.init.string() + ": no such file or folder"));
  c.init.clear();
  c.task = "classify";
  c.data = (dir.path() / "text.txt").string();
  std::ofstream(c.data) << "some text\n";
  REQUIRE_THROWS_WITH(run(c), Contains("a text file has no labels"));
  // Weights of another model: none of its names match.
  train::Config image = small_cnn();
  image.checkpoint_dir = dir.path() / "cnn";
  image.epochs = 1;
  run(image);
  c = small_bert();
  c.init = image.checkpoint_dir;
  REQUIRE_THROWS_WITH(run(c), Contains("none of its"));
}
