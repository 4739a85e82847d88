#pragma once
// WordPiece: BERT's tokenizer. Text is cleaned and split into words (basic tokenization:
// whitespace, punctuation, CJK characters, optional lower-casing and accent stripping),
// then each word into the longest vocabulary pieces from its left, later pieces written
// with a "##" prefix ("unaffable" -> "un", "##aff", "##able"); a word with no such split,
// or longer than max_chars_per_word characters, becomes [UNK].
//
//   auto wp = data::WordPiece::load("vocab.txt");
//   std::vector<int64_t> ids = wp.encode("Hello, world!");   // [CLS] hello , world ! [SEP]
//
// Unicode: text is UTF-8 (invalid UTF-8 is a kiln::Error). Lower-casing and accent
// stripping cover ASCII, Latin-1, Latin Extended-A (and its digraphs DŽ, LJ, NJ), Greek and
// Cyrillic (without ICU, other scripts pass through unchanged); punctuation is ASCII's plus
// the Latin-1, General Punctuation, CJK and full-width punctuation blocks. On WordNet's
// glosses and on text in those scripts the ids equal those of Hugging Face's
// BertWordPieceTokenizer (tools/wordpiece_parity.py).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::data {

struct WordPieceOptions {
  bool lower_case = true;     // BERT's uncased models
  bool strip_accents = true;  // "café" -> "cafe" (BERT ties this to lower_case)
  int64_t max_chars_per_word = 100;
};

// The special tokens every vocabulary must hold, in the order the trainer writes them
// (ids 0 to 4 of a trained vocabulary).
inline constexpr std::string_view kPadToken = "[PAD]", kUnkToken = "[UNK]", kClsToken = "[CLS]",
                                  kSepToken = "[SEP]", kMaskToken = "[MASK]";

class WordPiece {
 public:
  // `tokens[i]` is id i. Throws kiln::Error for a duplicate or empty token, a missing special
  // token, or max_chars_per_word < 1.
  explicit WordPiece(std::vector<std::string> tokens, WordPieceOptions options = {});
  // Reads a vocab.txt: one token per line, line n (from 0) is id n; "\r\n" endings allowed.
  static WordPiece load(const std::filesystem::path& vocab_file, WordPieceOptions options = {});
  // Writes the vocabulary as a vocab.txt (to a temporary file, renamed into place).
  void save(const std::filesystem::path& vocab_file) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }
  const WordPieceOptions& options() const { return options_; }
  // The id of `token`, or -1 when it is not in the vocabulary.
  int64_t find(std::string_view token) const;
  // The token of `id`; kiln::Error outside [0, vocab_size()).
  const std::string& token(int64_t id) const;

  int64_t pad_id() const { return pad_; }
  int64_t unk_id() const { return unk_; }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }
  int64_t mask_id() const { return mask_; }
  // Whether `id` is one of the five special tokens.
  bool is_special(int64_t id) const;

  // The words of `text` after basic tokenization (no vocabulary involved).
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // The WordPiece ids of `text`, without [CLS] or [SEP].
  std::vector<int64_t> tokenize(std::string_view text) const;
  // [CLS] text [SEP].
  std::vector<int64_t> encode(std::string_view text) const;
  // [CLS] a [SEP] b [SEP], BERT's sentence pair.
  std::vector<int64_t> encode(std::string_view a, std::string_view b) const;
  // Tokens joined by spaces, "##" pieces glued to the piece before; special tokens left out
  // unless `keep_special`. kiln::Error for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids, bool keep_special = false) const;

 private:
  void split_word(const std::string& word, std::vector<int64_t>& out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  WordPieceOptions options_;
  int64_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
};

// Basic tokenization alone (what WordPiece::basic_tokenize does).
std::vector<std::string> basic_tokenize(std::string_view text, const WordPieceOptions& options);

struct WordPieceTrainOptions {
  int64_t vocab_size = 8192;   // specials + alphabet + merges, at most
  int64_t min_frequency = 2;   // a pair seen fewer times in the corpus is never merged
  WordPieceOptions tokenizer = {};  // the basic tokenization the corpus is split with
};

// Builds a vocabulary from `documents`. The alphabet (each character of the corpus as it
// occurs: "c" where it starts a word, "##c" where it continues one; in byte order) comes
// after the five specials; then
// pairs of adjacent pieces are merged, most frequent first (counted over all words,
// weighted by how often each word occurs: byte-pair encoding's rule, which Hugging Face's
// WordPiece trainer also uses, rather than the likelihood score count(ab) / (count(a)
// count(b))). Ties go to the pair whose (left, right) strings come first in byte order, so
// the result is a pure function of the corpus and options. Merging "a" and "##b" makes
// "ab"; "##a" and "##b" make "##ab". Stops at vocab_size or when no pair occurs
// min_frequency times. kiln::Error when vocab_size cannot hold the specials and alphabet.
std::vector<std::string> train_wordpiece(const std::vector<std::string>& documents,
                                         const WordPieceTrainOptions& options = {});

}  // namespace kiln::data
