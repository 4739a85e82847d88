// What a kiln-train run trains on: its data sets (images, or text with its vocabulary), its
// model, and the weights --init starts it from.
#include "tools/train_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "core/disk_cache.h"
#include "core/error.h"
#include "data/datasets.h"
#include "data/image.h"
#include "data/text.h"
#include "data/wordnet.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "models/resnet.h"
#include "models/safetensors.h"
#include "models/small_models.h"
#include "tools/checkpoint.h"

namespace kiln::train {
namespace fs = std::filesystem;

namespace {

// An evenly spaced subset: sample i is base's i * size / count, so every class of a data
// set stored class by class (an image folder) keeps its share.
class EvenSubset : public data::Dataset {
 public:
  EvenSubset(std::shared_ptr<const data::Dataset> base, int64_t count) : base_(std::move(base)), count_(count) {}
  int64_t size() const override { return count_; }
  int64_t num_classes() const override { return base_->num_classes(); }
  std::vector<int64_t> sample_shape() const override { return base_->sample_shape(); }
  std::optional<int64_t> padding_id() const override { return base_->padding_id(); }
  data::Sample get(int64_t index, data::SampleRng& rng) const override {
    KILN_CHECK(index >= 0 && index < count_, "subset: index {} out of range for {} samples", index, count_);
    return base_->get(index * base_->size() / count_, rng);
  }
  std::string describe() const override {
    return fmt::format("{} of {}", count_, base_->describe());
  }

 private:
  std::shared_ptr<const data::Dataset> base_;
  int64_t count_;
};

std::shared_ptr<const data::Dataset> subset(std::shared_ptr<const data::Dataset> d, int64_t count) {
  if (count <= 0 || count >= d->size()) return d;
  return std::make_shared<EvenSubset>(std::move(d), count);
}

fs::path cache_root(const Config& c) {
  if (!c.cache_dir.empty()) return c.cache_dir;
  // The kernel cache's root (never a folder shared with other users).
  fs::path root = disk_cache::root();
  KILN_CHECK(!root.empty(),
             "kiln-train: --data shapes: no cache folder to generate the data set in (HOME, XDG_CACHE_HOME and "
             "KILN_CACHE_DIR are unset); give --cache-dir DIR");
  return root;
}

// A text file's documents: its paragraphs, separated by blank lines (lines of spaces only).
std::vector<std::string> read_documents(const fs::path& file) {
  std::ifstream in(file);
  KILN_CHECK(in.good(), "kiln-train: --data {}: cannot read the file", file.string());
  std::vector<std::string> documents;
  std::string line, document;
  auto flush = [&] {
    if (!document.empty()) documents.push_back(std::move(document));
    document.clear();
  };
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) flush();
    else document += (document.empty() ? "" : " ") + line;
  }
  flush();
  KILN_CHECK(!documents.empty(), "kiln-train: --data {}: no text in the file", file.string());
  return documents;
}

bool is_wordnet(const Config& c) { return c.data == "wordnet" || fs::is_regular_file(fs::path(c.data) / "data.noun"); }

// The vocabulary file a run reads: --vocab; a resumed run's own (saved with its first
// checkpoint); the one beside --init's weights (a checkpoint folder's, or in the folder
// above a step folder or a file); none (train one).
fs::path vocab_file(const Config& c) {
  if (!c.vocab.empty()) return c.vocab;
  if (c.resume && fs::is_regular_file(c.checkpoint_dir / "vocab.txt")) return c.checkpoint_dir / "vocab.txt";
  if (!c.init.empty()) {
    const fs::path dir = fs::is_directory(c.init) ? c.init : c.init.parent_path();
    for (const fs::path& f : {dir / "vocab.txt", dir.parent_path() / "vocab.txt"})
      if (fs::is_regular_file(f)) return f;
  }
  return {};
}

}  // namespace

DataSets make_data(const Config& c) {
  DataSets d;
  if (c.data == "synthetic") {
    const int64_t size = c.image_size > 0 ? c.image_size : 224;
    d.train = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{
        .size = c.synthetic_size, .num_classes = c.synthetic_classes, .image_size = size, .seed = c.seed});
    d.val = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{
        .size = std::max<int64_t>(c.synthetic_size / 8, 1), .num_classes = c.synthetic_classes,
        .image_size = size, .seed = c.seed + 1});
  } else if (c.data == "fashion-mnist") {
    // Without resizing or padding the data set normalizes its 28 x 28 images itself.
    std::vector<data::ImageTransform> steps;
    if (c.image_size > 0 && c.image_size != 28) steps.push_back(data::resize(c.image_size, c.image_size));
    // center_crop to a larger size pads with black, as torchvision's Pad before Normalize.
    if (c.pad > 0) steps.push_back(data::center_crop((c.image_size > 0 ? c.image_size : 28) + 2 * c.pad));
    std::optional<data::Transforms> transforms;
    if (!steps.empty()) transforms = data::Transforms{.steps = steps, .mean = {0.2860f}, .std = {0.3530f}};
    d.train = std::make_shared<data::FashionMnist>(data::kFashionMnistDir, data::Split::train, transforms);
    d.val = std::make_shared<data::FashionMnist>(data::kFashionMnistDir, data::Split::test, transforms);
  } else {
    fs::path root = c.data;
    int64_t size = c.image_size > 0 ? c.image_size : 224;
    std::vector<data::ImageTransform> train_steps, val_steps;
    if (c.data == "shapes") {
      root = cache_root(c) / "shapes";
      data::generate_shapes(root);
      size = c.image_size > 0 ? c.image_size : 64;
      train_steps = {data::random_resized_crop(size, {0.6, 1.0}), data::random_horizontal_flip()};
      val_steps = {data::resize(size, size)};
    } else {
      KILN_CHECK(fs::is_directory(root),
                 "kiln-train: --data {}: not synthetic, fashion-mnist, shapes or an existing folder", c.data);
      train_steps = {data::random_resized_crop(size), data::random_horizontal_flip()};
      val_steps = {data::resize(size * 8 / 7), data::center_crop(size)};
    }
    if (c.pad > 0) {
      train_steps.push_back(data::center_crop(size + 2 * c.pad));  // black borders
      val_steps.push_back(data::center_crop(size + 2 * c.pad));
    }
    const bool split = fs::is_directory(root / "train");
    const std::vector<int64_t> shape = {3, size + 2 * c.pad, size + 2 * c.pad};
    d.train = std::make_shared<data::ImageFolder>(
        split ? root / "train" : root,
        data::Transforms{.steps = train_steps, .mean = data::kImageNetMean, .std = data::kImageNetStd}, shape);
    if (fs::is_directory(root / "val"))
      d.val = std::make_shared<data::ImageFolder>(
          root / "val", data::Transforms{.steps = val_steps, .mean = data::kImageNetMean, .std = data::kImageNetStd},
          shape);
  }
  d.train = subset(d.train, c.train_samples);
  if (d.val) d.val = subset(d.val, c.val_samples);
  return d;
}

DataSets make_text_data(const Config& c, std::shared_ptr<const data::WordPiece>& tokenizer, std::string& vocab_source) {
  const std::string task = task_of(c);
  std::vector<std::string> train_docs, val_docs;
  std::optional<data::TextTask> train_task, val_task;
  if (is_wordnet(c)) {
    const std::vector<data::WordnetSynset> synsets =
        data::read_wordnet(c.data == "wordnet" ? data::kWordnetDir : fs::path(c.data));
    train_docs = data::wordnet_corpus(synsets, data::Split::train);
    if (task == "classify") {
      train_task = data::wordnet_lex_task(synsets, data::Split::train);
      val_task = data::wordnet_lex_task(synsets, data::Split::test);
    } else {
      val_docs = data::wordnet_corpus(synsets, data::Split::test);
    }
  } else {
    KILN_CHECK(fs::is_regular_file(c.data),
               "kiln-train: --data {}: not wordnet, a folder of WordNet's data files (data.noun, ...) or a text file",
               c.data);
    KILN_CHECK(task != "classify",
               "kiln-train: --data {} --task classify: a text file has no labels; classify WordNet's glosses "
               "(--data wordnet)",
               c.data);
    std::vector<std::string> documents = read_documents(c.data);
    for (size_t i = 0; i < documents.size(); ++i)
      (i % 10 == 9 ? val_docs : train_docs).push_back(std::move(documents[i]));
  }
  if (const fs::path file = vocab_file(c); !file.empty()) {
    tokenizer = std::make_shared<const data::WordPiece>(data::WordPiece::load(file));
    vocab_source = file.string();
  } else {
    const auto start = std::chrono::steady_clock::now();
    tokenizer = std::make_shared<const data::WordPiece>(
        data::train_wordpiece(train_docs, {.vocab_size = c.vocab_size}));
    vocab_source = fmt::format("trained on the training text in {:.1f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const std::string name = is_wordnet(c) ? "WordNet glosses" : fs::path(c.data).filename().string();
  DataSets d;
  if (task == "classify") {
    d.train = std::make_shared<data::TextClassification>(*train_task, tokenizer, c.seq_len,
                                                         name + " -> lexicographer file");
    d.val = std::make_shared<data::TextClassification>(*val_task, tokenizer, c.seq_len,
                                                       "held-out " + name + " -> lexicographer file");
  } else {
    const auto language_model = [&](const std::vector<std::string>& docs,
                                     const std::string& what) -> std::shared_ptr<const data::Dataset> {
      auto text = std::make_shared<const data::PackedText>(docs, tokenizer, c.seq_len, what);
      if (task == "mlm")
        return std::make_shared<const data::MaskedLM>(text, tokenizer,
                                                      data::MaskedLMOptions{.mask_prob = c.mlm_probability});
      return std::make_shared<const data::CausalLM>(text, tokenizer);
    };
    d.train = language_model(train_docs, name);
    if (!val_docs.empty()) d.val = language_model(val_docs, "held-out " + name);
  }
  d.train = subset(d.train, c.train_samples);
  if (d.val) d.val = subset(d.val, c.val_samples);
  return d;
}

fs::path init_weights_file(const fs::path& init) {
  if (fs::is_regular_file(init)) return init;
  KILN_CHECK(fs::is_directory(init), "kiln-train: --init {}: no such file or folder", init.string());
  if (fs::is_regular_file(init / "model.safetensors")) return init / "model.safetensors";
  const std::vector<fs::path> folders = checkpoint_folders(init);
  KILN_CHECK(!folders.empty(), "kiln-train: --init {}: neither a checkpoint folder nor a step folder (no "
             "model.safetensors)", init.string());
  return folders.back() / "model.safetensors";
}

std::string load_init(nn::Module& model, const fs::path& file) {
  const StateDict state = load_safetensors(file.string());
  const StateDict own = model.state_dict();
  StateDict kept;
  std::vector<std::string> fresh;
  int64_t unused = 0;
  for (const auto& [name, t] : state) {
    if (own.contains(name)) kept[name] = t;
    else ++unused;
  }
  for (const auto& [name, t] : own)
    if (!state.contains(name)) fresh.push_back(name);
  KILN_CHECK(!kept.empty(), "kiln-train: --init {}: none of its {} tensors is a weight of {} (its names are not the "
             "model's: another architecture?)", file.string(), state.size(), model.type_name());
  model.load_state_dict(kept, /*strict=*/false);
  const size_t shown = std::min<size_t>(fresh.size(), 4);
  return fmt::format("{} tensors from {}{}{}", kept.size(), file.string(),
                     fresh.empty() ? std::string()
                                   : fmt::format("; initialized fresh: {}{}",
                                                 fmt::join(fresh.begin(), fresh.begin() + shown, ", "),
                                                 fresh.size() > shown ? fmt::format(" and {} more", fresh.size() - shown)
                                                                      : std::string()),
                     unused > 0 ? fmt::format("; {} of the file's tensors unused", unused) : std::string());
}

std::shared_ptr<nn::Module> make_model(const std::string& arch, int64_t classes, int64_t channels,
                                       int64_t image_size, bool zero_init_residual) {
  // zero_init_residual: each residual block starts as the identity (its last BatchNorm
  // weight is zero), which keeps the first steps of training from scratch stable ("Bag of
  // Tricks", He et al. 2019); torchvision's default is off.
  const models::ResNetOptions options{
      .num_classes = classes, .zero_init_residual = zero_init_residual, .in_channels = channels};
  if (arch == "resnet18") return std::make_shared<models::ResNet>(models::resnet18(options));
  if (arch == "resnet34") return std::make_shared<models::ResNet>(models::resnet34(options));
  if (arch == "resnet50") return std::make_shared<models::ResNet>(models::resnet50(options));
  if (arch == "resnet101") return std::make_shared<models::ResNet>(models::resnet101(options));
  if (arch == "resnet152") return std::make_shared<models::ResNet>(models::resnet152(options));
  if (arch == "mlp")
    return std::make_shared<models::MLP>(models::MLP({channels * image_size * image_size, 256, 128, classes}));
  if (arch == "cnn")
    return std::make_shared<models::ConvNet>(models::ConvNet({.in_channels = channels, .num_classes = classes}));
  fail("kiln-train: --arch {}: expected resnet18, resnet34, resnet50, resnet101, resnet152, mlp or cnn", arch);
}

bool is_text_arch(const std::string& arch) { return arch.starts_with("bert-") || arch.starts_with("gpt2-"); }

std::shared_ptr<nn::Module> make_text_model(const std::string& arch, const std::string& task, int64_t vocab_size,
                                            int64_t classes, int64_t seq_len, int64_t pad_id) {
  const std::string size = arch.substr(arch.find('-') + 1);
  if (arch.starts_with("bert-")) {
    KILN_CHECK(size == "tiny" || size == "mini" || size == "base" || size == "large",
               "kiln-train: --arch {}: expected bert-tiny, bert-mini, bert-base or bert-large", arch);
    models::BertConfig config = size == "tiny"   ? models::BertConfig::tiny(vocab_size)
                                : size == "mini" ? models::BertConfig::mini(vocab_size)
                                : size == "base" ? models::BertConfig::base(vocab_size)
                                                 : models::BertConfig::large(vocab_size);
    config.max_position_embeddings = std::max(config.max_position_embeddings, seq_len);
    config.pad_token_id = pad_id;
    if (task == "mlm") return std::make_shared<models::BertForMaskedLM>(config);
    if (task == "classify") return std::make_shared<models::BertForSequenceClassification>(config, classes);
    fail("kiln-train: --arch {} --task {}: BERT learns mlm (masked LM) or classify", arch, task);
  }
  if (arch.starts_with("gpt2-")) {
    KILN_CHECK(size == "tiny" || size == "mini" || size == "small",
               "kiln-train: --arch {}: expected gpt2-tiny, gpt2-mini or gpt2-small", arch);
    models::GPT2Config config = size == "tiny"   ? models::GPT2Config::tiny(vocab_size)
                                : size == "mini" ? models::GPT2Config::mini(vocab_size)
                                                 : models::GPT2Config::small(vocab_size);
    config.n_positions = std::max(config.n_positions, seq_len);
    KILN_CHECK(task == "clm", "kiln-train: --arch {} --task {}: GPT-2 learns clm (the next token)", arch, task);
    return std::make_shared<models::GPT2LMHeadModel>(config);
  }
  fail("kiln-train: --arch {}: not a transformer (bert-* or gpt2-*)", arch);
}

}  // namespace kiln::train
