// kiln-text: the WordNet text corpus and task, with a WordPiece vocabulary trained on the
// corpus: the figures a training run is judged against (majority-class share, unigram
// entropy), and the vocabulary written as a vocab.txt.
//
//   kiln-text                                  # figures for a 4096-token vocabulary
//   kiln-text --vocab-size 8192 --out vocab.txt
//   kiln-text --wordnet tests/data/wordnet     # another copy of WordNet's data files
//   kiln-text --vocab vocab.txt --encode FILE  # each line of FILE as ids ([CLS] ... [SEP])
#include <fmt/format.h>
#include <kiln.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tools/report_errors.h"

using namespace kiln;

namespace {

struct Args {
  std::filesystem::path wordnet = data::kWordnetDir;
  int64_t vocab_size = 4096;
  std::vector<int64_t> lengths{32, 64, 128};  // max_length values to report truncation at
  std::filesystem::path out;
  bool classes = false;          // print each class's counts
  std::filesystem::path vocab;   // with --encode: the vocabulary to encode with
  std::filesystem::path encode;  // a text file to encode, one line at a time
};

int64_t parse_count(const std::string& flag, const char* text) {
  int64_t value = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  KILN_CHECK(ec == std::errc() && ptr == end && value > 0,
             "kiln-text: {} '{}' is not a positive integer", flag, text);
  return value;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::cout << "usage: kiln-text [--wordnet DIR] [--vocab-size N] [--out vocab.txt] "
                   "[--classes]\n       kiln-text --vocab vocab.txt --encode FILE\n";
      std::exit(0);
    }
    if (flag == "--classes") {
      args.classes = true;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-text: {} needs a value", flag);
    const char* value = argv[++i];
    if (flag == "--wordnet")
      args.wordnet = value;
    else if (flag == "--vocab-size")
      args.vocab_size = parse_count(flag, value);
    else if (flag == "--out")
      args.out = value;
    else if (flag == "--vocab")
      args.vocab = value;
    else if (flag == "--encode")
      args.encode = value;
    else
      fail("kiln-text: unknown option {} (see --help)", flag);
  }
  return args;
}

// The most frequent label and its share of `labels`.
std::pair<int64_t, double> majority(const std::vector<int64_t>& labels, int64_t classes) {
  std::vector<int64_t> counts(static_cast<size_t>(classes), 0);
  for (int64_t l : labels) ++counts[static_cast<size_t>(l)];
  const auto top = std::max_element(counts.begin(), counts.end());
  return {top - counts.begin(), static_cast<double>(*top) / static_cast<double>(labels.size())};
}

// Each line of args.encode as ids, space-separated, one line each (BERT's uncased
// tokenization); for comparing with another tokenizer.
int encode_lines(const Args& args) {
  KILN_CHECK(!args.vocab.empty(), "kiln-text: --encode needs --vocab");
  const data::WordPiece wp = data::WordPiece::load(args.vocab);
  std::ifstream in(args.encode, std::ios::binary);
  KILN_CHECK(in.good(), "kiln-text: cannot read {}", args.encode.string());
  std::string line;
  std::string out;
  while (std::getline(in, line)) {
    out.clear();
    for (int64_t id : wp.encode(line)) out += fmt::format("{}{}", out.empty() ? "" : " ", id);
    fmt::print("{}\n", out);
  }
  return 0;
}

// A reference point for the task that no transformer is needed for: multinomial naive
// Bayes over the glosses' tokens (add-one smoothing), trained on `train`, scored on `val`.
double naive_bayes_accuracy(const data::TextTask& train, const data::TextTask& val,
                            const data::WordPiece& wp) {
  const size_t classes = train.class_names.size();
  const auto v = static_cast<size_t>(wp.vocab_size());
  std::vector<double> counts(classes * v, 0.0), totals(classes, 0.0), docs(classes, 0.0);
  for (size_t i = 0; i < train.texts.size(); ++i) {
    const auto c = static_cast<size_t>(train.labels[i]);
    docs[c] += 1;
    for (int64_t id : wp.tokenize(train.texts[i]))
      counts[c * v + static_cast<size_t>(id)] += 1, totals[c] += 1;
  }
  int64_t correct = 0;
  for (size_t i = 0; i < val.texts.size(); ++i) {
    const std::vector<int64_t> ids = wp.tokenize(val.texts[i]);
    size_t best = 0;
    double best_score = -INFINITY;
    for (size_t c = 0; c < classes; ++c) {
      if (docs[c] == 0) continue;
      double score = std::log(docs[c] / static_cast<double>(train.texts.size()));
      for (int64_t id : ids)
        score += std::log((counts[c * v + static_cast<size_t>(id)] + 1) /
                          (totals[c] + static_cast<double>(v)));
      if (score > best_score) best_score = score, best = c;
    }
    correct += static_cast<int64_t>(best) == val.labels[i] ? 1 : 0;
  }
  return static_cast<double>(correct) / static_cast<double>(val.texts.size());
}

int run(const Args& args) {
  if (!args.encode.empty()) return encode_lines(args);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<data::WordnetSynset> synsets = data::read_wordnet(args.wordnet);
  const data::TextTask train = data::wordnet_lex_task(synsets, data::Split::train);
  const data::TextTask val = data::wordnet_lex_task(synsets, data::Split::test);
  const auto& names = data::wordnet_lex_names();
  fmt::print("WordNet {}: {} synsets, {} training and {} held out (validation)\n",
             args.wordnet.string(), synsets.size(), train.texts.size(), val.texts.size());
  std::vector<bool> used(names.size(), false);
  for (int64_t l : train.labels) used[static_cast<size_t>(l)] = true;
  fmt::print("task: gloss -> lexicographer file, {} classes ({} in the training glosses)\n",
             names.size(), std::count(used.begin(), used.end(), true));
  KILN_CHECK(!train.texts.empty() && !val.texts.empty(),
             "kiln-text: {} gives {} training and {} validation glosses: need some of each",
             args.wordnet.string(), train.texts.size(), val.texts.size());
  const auto [train_top, train_share] = majority(train.labels, static_cast<int64_t>(names.size()));
  const auto [val_top, val_share] = majority(val.labels, static_cast<int64_t>(names.size()));
  fmt::print(
      "majority class: {} ({:.2f}% of training glosses); {} ({:.2f}% of validation glosses)\n",
      names[static_cast<size_t>(train_top)], 100 * train_share, names[static_cast<size_t>(val_top)],
      100 * val_share);

  if (args.classes) {
    std::vector<int64_t> train_counts(names.size(), 0), val_counts(names.size(), 0);
    for (int64_t l : train.labels) ++train_counts[static_cast<size_t>(l)];
    for (int64_t l : val.labels) ++val_counts[static_cast<size_t>(l)];
    fmt::print("{:>3} {:<20} {:>8} {:>10}\n", "id", "lexicographer file", "training", "validation");
    for (size_t k = 0; k < names.size(); ++k)
      fmt::print("{:>3} {:<20} {:>8} {:>10}\n", k, names[k], train_counts[k], val_counts[k]);
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> vocab =
      data::train_wordpiece(train.texts, {.vocab_size = args.vocab_size});
  const double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto tokenizer = std::make_shared<const data::WordPiece>(std::move(vocab));
  fmt::print(
      "WordPiece vocabulary: {} tokens (asked {}), trained on the training glosses in {:.1f} s\n",
      tokenizer->vocab_size(), args.vocab_size, train_s);

  const data::PackedText corpus(train.texts, tokenizer, 128, "wordnet glosses");
  int64_t unknown = 0;
  for (int32_t id : corpus.stream()) unknown += id == tokenizer->unk_id() ? 1 : 0;
  const int64_t tokens =
      static_cast<int64_t>(corpus.stream().size()) - corpus.documents();  // no [SEP]s
  const double h = data::unigram_entropy_bits(corpus.stream(), *tokenizer);
  fmt::print(
      "corpus: {} glosses, {} tokens without [SEP]s ({:.2f} a gloss, {} [UNK]), {} blocks of 128\n",
      corpus.documents(), tokens,
      static_cast<double>(tokens) / static_cast<double>(corpus.documents()), unknown,
      corpus.size());
  fmt::print("unigram entropy: {:.3f} bits per token = {:.3f} nats\n", h, h * std::log(2.0));
  const double b = data::masked_lm_baseline_bits(corpus.stream(), *tokenizer);
  fmt::print(
      "masked-LM loss without context (15%, 80/10/10): {:.3f} bits = {:.3f} nats per predicted "
      "token\n",
      b, b * std::log(2.0));
  const data::PackedText held_out(val.texts, tokenizer, 128, "validation glosses");
  const double h_val = data::unigram_entropy_bits(held_out.stream(), *tokenizer);
  fmt::print("validation glosses: unigram entropy {:.3f} bits per token = {:.3f} nats\n", h_val,
             h_val * std::log(2.0));
  for (int64_t length : args.lengths) {
    const data::TextClassification task(train, tokenizer, length);
    fmt::print("classification at max_length {}: {:.2f}% of training glosses cut\n", length,
               100.0 * static_cast<double>(task.truncated()) / static_cast<double>(task.size()));
  }
  const double nb = naive_bayes_accuracy(train, val, *tokenizer);
  fmt::print("bag-of-tokens naive Bayes (add-one smoothing): {:.2f}% validation accuracy\n",
             100 * nb);
  if (!args.out.empty()) {
    tokenizer->save(args.out);
    fmt::print("wrote {}\n", args.out.string());
  }
  fmt::print("{:.1f} s in all\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tools::report_errors("kiln-text", 1, [&] { return run(parse_args(argc, argv)); });
}
