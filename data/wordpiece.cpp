#include "data/wordpiece.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/regular_file.h"
#include "core/utf8.h"

namespace kiln::data {

namespace {

// Decodes the code point at text[pos], advancing pos; kiln::Error on invalid UTF-8
// (overlong forms, surrogates and values past U+10FFFF included).
char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  int extra;
  char32_t cp;
  if (b0 < 0x80) {
    ++pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    extra = 1, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3, cp = b0 & 0x07;
  } else {
    fail("WordPiece: invalid UTF-8: byte 0x{:02x} at offset {} cannot start a character", b0, pos);
  }
  for (int k = 1; k <= extra; ++k) {
    KILN_CHECK(pos + k < text.size() && (byte(pos + k) & 0xC0) == 0x80,
               "WordPiece: invalid UTF-8: the character at offset {} lacks continuation byte {}",
               pos, k);
    cp = (cp << 6) | (byte(pos + k) & 0x3F);
  }
  static constexpr char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  KILN_CHECK(
      cp >= kMin[extra] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF),
      "WordPiece: invalid UTF-8: overlong form, surrogate or value past U+10FFFF at offset {}",
      pos);
  pos += static_cast<size_t>(extra) + 1;
  return cp;
}

bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Control and format characters (Unicode Cc, Cf), NUL and U+FFFD: dropped, as BERT does.
bool is_dropped(char32_t c) {
  return c == 0 || c == 0xFFFD || (c < 0x20 && c != '\t' && c != '\n' && c != '\r') ||
         (c >= 0x7F && c <= 0x9F) || c == 0xAD || (c >= 0x200B && c <= 0x200F) ||
         (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) || c == 0xFEFF;
}

bool is_punctuation(char32_t c) {
  // BERT counts all non-alphanumeric ASCII as punctuation ("$", "^", "`" included).
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  return c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF ||
         (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) ||
         (c >= 0x3001 && c <= 0x3003) || (c >= 0x3008 && c <= 0x3011) ||
         (c >= 0x3014 && c <= 0x301F) || (c >= 0xFF01 && c <= 0xFF0F) ||
         (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
         (c >= 0xFF5B && c <= 0xFF65);
}

// The CJK Unified Ideographs blocks, each ideograph a word of its own (BERT's ranges).
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0xC0) return c;
  if (c <= 0xDE) return c == 0xD7 ? c : c + 32;
  if (c == 0x130) return 'i';  // İ: Unicode lower-cases it to "i" + U+0307
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c % 2 == 0) ? c + 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if (c == 0x1C4 || c == 0x1C7 || c == 0x1CA) return c + 2;   // the digraphs DŽ, LJ, NJ
  if (c == 0x1C5 || c == 0x1C8 || c == 0x1CB) return c + 1;   // and their title cases
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;  // Greek
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;  // Cyrillic
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

// The base letter of a Latin-1 or Latin Extended-A letter with a diacritic (its Unicode
// canonical decomposition without the combining mark); '.' where there is none (Æ, Ø, Ł).
constexpr std::string_view kLatin1Base =
    "AAAAAA.CEEEEIIII.NOOOOO..UUUUY..aaaaaa.ceeeeiiii.nooooo..uuuuy.y";
constexpr std::string_view kLatinExtABase =
    "AaAaAaCcCcCcCcDd..EeEeEeEeEeGgGgGgGgHh..IiIiIiIiI...JjKk.LlLlLl....NnNnNn...OoOoOo.."
    "RrRrRrSsSsSsSsTtTt.."
    "UuUuUuUuUuUuWwYyYZzZzZz.";
static_assert(kLatin1Base.size() == 64 && kLatinExtABase.size() == 128);

// Accent stripping: NFD, then the combining marks (U+0300 to U+036F) dropped, for Latin-1,
// Latin Extended-A, Greek and Cyrillic. Returns 0 for a character that is itself a
// combining mark.
char32_t strip_accent(char32_t c) {
  if (c >= 0x300 && c <= 0x36F) return 0;
  if (c >= 0xC0 && c <= 0xFF && kLatin1Base[c - 0xC0] != '.')
    return static_cast<char32_t>(kLatin1Base[c - 0xC0]);
  if (c >= 0x100 && c <= 0x17F && kLatinExtABase[c - 0x100] != '.')
    return static_cast<char32_t>(kLatinExtABase[c - 0x100]);
  switch (c) {  // Greek with tonos or dialytika, Cyrillic with breve or diaeresis
    case 0x386:
      return 0x391;
    case 0x388:
      return 0x395;
    case 0x389:
      return 0x397;
    case 0x38A:
    case 0x3AA:
      return 0x399;
    case 0x38C:
      return 0x39F;
    case 0x38E:
    case 0x3AB:
      return 0x3A5;
    case 0x38F:
      return 0x3A9;
    case 0x3AC:
      return 0x3B1;
    case 0x3AD:
      return 0x3B5;
    case 0x3AE:
      return 0x3B7;
    case 0x3AF:
    case 0x390:
    case 0x3CA:
      return 0x3B9;
    case 0x3CC:
      return 0x3BF;
    case 0x3CD:
    case 0x3B0:
    case 0x3CB:
      return 0x3C5;
    case 0x3CE:
      return 0x3C9;
    case 0x400:
    case 0x401:
      return 0x415;
    case 0x403:
      return 0x413;
    case 0x407:
      return 0x406;
    case 0x40C:
      return 0x41A;
    case 0x40D:
    case 0x419:
      return 0x418;
    case 0x40E:
      return 0x423;
    case 0x450:
    case 0x451:
      return 0x435;
    case 0x453:
      return 0x433;
    case 0x457:
      return 0x456;
    case 0x45C:
      return 0x43A;
    case 0x45D:
    case 0x439:
      return 0x438;
    case 0x45E:
      return 0x443;
    default:
      return c;
  }
}

// Offsets of the code points of valid UTF-8 `word`, plus its size at the end.
std::vector<size_t> code_point_offsets(std::string_view word) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < word.size()) {
    offsets.push_back(pos);
    next_code_point(word, pos);
  }
  offsets.push_back(word.size());
  return offsets;
}

constexpr std::string_view kContinuation = "##";

}  // namespace

std::vector<std::string> basic_tokenize(std::string_view text, const WordPieceOptions& options) {
  std::vector<std::string> words;
  std::string word;
  const auto flush = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t c = next_code_point(text, pos);
    if (is_dropped(c)) continue;
    if (is_whitespace(c)) {
      flush();
      continue;
    }
    if (options.lower_case) c = to_lower(c);
    if (options.strip_accents && (c = strip_accent(c)) == 0) continue;
    if (is_punctuation(c) || is_cjk(c)) {
      flush();
      append_utf8(word, c);
      flush();
      continue;
    }
    append_utf8(word, c);
  }
  flush();
  return words;
}

WordPiece::WordPiece(std::vector<std::string> tokens, WordPieceOptions options)
    : tokens_(std::move(tokens)), options_(options) {
  KILN_CHECK(options_.max_chars_per_word >= 1,
             "WordPiece: max_chars_per_word {} must be at least 1", options_.max_chars_per_word);
  ids_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    KILN_CHECK(!tokens_[i].empty(), "WordPiece: token {} of the vocabulary is empty", i);
    const auto [it, added] = ids_.emplace(tokens_[i], static_cast<int64_t>(i));
    KILN_CHECK(added, "WordPiece: token '{}' is in the vocabulary twice (ids {} and {})",
               tokens_[i], it->second, i);
  }
  const auto special = [&](std::string_view name) {
    const int64_t id = find(name);
    KILN_CHECK(id >= 0, "WordPiece: the vocabulary ({} tokens) lacks the special token {}",
               tokens_.size(), name);
    return id;
  };
  pad_ = special(kPadToken);
  unk_ = special(kUnkToken);
  cls_ = special(kClsToken);
  sep_ = special(kSepToken);
  mask_ = special(kMaskToken);
}

WordPiece WordPiece::load(const std::filesystem::path& vocab_file, WordPieceOptions options) {
  // Through RegularFile: a FIFO or a directory at the path is refused, not read forever.
  const RegularFile file(vocab_file, "WordPiece");
  std::string text(static_cast<size_t>(file.size()), '\0');
  file.read_at(text.data(), text.size(), 0);
  std::vector<std::string> tokens;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    KILN_CHECK(!line.empty(), "WordPiece: {}: line {} is empty (one token per line)",
               vocab_file.string(), tokens.size() + 1);
    tokens.push_back(std::move(line));
  }
  try {
    return WordPiece(std::move(tokens), options);
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), vocab_file.string());
  }
}

void WordPiece::save(const std::filesystem::path& vocab_file) const {
  const std::filesystem::path temp = vocab_file.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), "WordPiece: cannot write {}", temp.string());
    for (const std::string& t : tokens_) out << t << '\n';
    out.flush();
    KILN_CHECK(out.good(), "WordPiece: error writing {}", temp.string());
  }
  std::error_code ec;
  std::filesystem::rename(temp, vocab_file, ec);
  KILN_CHECK(!ec, "WordPiece: cannot rename {} to {}: {}", temp.string(), vocab_file.string(),
             ec.message());
}

int64_t WordPiece::find(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& WordPiece::token(int64_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), "WordPiece: id {} outside the vocabulary [0, {})", id,
             vocab_size());
  return tokens_[static_cast<size_t>(id)];
}

bool WordPiece::is_special(int64_t id) const {
  return id == pad_ || id == unk_ || id == cls_ || id == sep_ || id == mask_;
}

std::vector<std::string> WordPiece::basic_tokenize(std::string_view text) const {
  return data::basic_tokenize(text, options_);
}

void WordPiece::split_word(const std::string& word, std::vector<int64_t>& out) const {
  const std::vector<size_t> offsets = code_point_offsets(word);
  const size_t chars = offsets.size() - 1;
  if (static_cast<int64_t>(chars) > options_.max_chars_per_word) {
    out.push_back(unk_);
    return;
  }
  const size_t first_piece = out.size();
  std::string candidate;
  for (size_t start = 0; start < chars;) {
    int64_t found = -1;
    size_t end = chars;
    for (; end > start; --end) {
      candidate.assign(start == 0 ? "" : kContinuation);
      candidate.append(word, offsets[start], offsets[end] - offsets[start]);
      const auto it = ids_.find(candidate);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {
      // No piece covers the rest: the whole word is unknown, as in BERT.
      out.resize(first_piece);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

std::vector<int64_t> WordPiece::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const std::string& word : basic_tokenize(text)) split_word(word, ids);
  return ids;
}

std::vector<int64_t> WordPiece::encode(std::string_view text) const {
  std::vector<int64_t> ids{cls_};
  for (int64_t id : tokenize(text)) ids.push_back(id);
  ids.push_back(sep_);
  return ids;
}

std::vector<int64_t> WordPiece::encode(std::string_view a, std::string_view b) const {
  std::vector<int64_t> ids = encode(a);
  for (int64_t id : tokenize(b)) ids.push_back(id);
  ids.push_back(sep_);
  return ids;
}

std::string WordPiece::decode(const std::vector<int64_t>& ids, bool keep_special) const {
  std::string text;
  for (int64_t id : ids) {
    const std::string& t = token(id);
    if (!keep_special && is_special(id)) continue;
    if (t.size() > kContinuation.size() && t.starts_with(kContinuation) && !text.empty()) {
      text.append(t, kContinuation.size());
    } else {
      if (!text.empty()) text += ' ';
      text += t;
    }
  }
  return text;
}

std::vector<std::string> train_wordpiece(const std::vector<std::string>& documents,
                                         const WordPieceTrainOptions& options) {
  KILN_CHECK(options.min_frequency >= 1, "train_wordpiece: min_frequency {} must be at least 1",
             options.min_frequency);
  // Distinct words and their counts, in byte order so that symbol ids do not depend on hashing.
  std::map<std::string, int64_t> word_counts;
  for (const std::string& doc : documents)
    for (std::string& w : basic_tokenize(doc, options.tokenizer)) ++word_counts[std::move(w)];

  // The alphabet: each character in the form it takes in the words, "c" where it starts one,
  // "##c" where it continues one (a punctuation mark, always a word of its own, gets no ##
  // form). Words past max_chars_per_word are [UNK] whatever the vocabulary, and left out.
  const auto too_long = [&](const std::vector<size_t>& offsets) {
    return static_cast<int64_t>(offsets.size() - 1) > options.tokenizer.max_chars_per_word;
  };
  std::set<std::string> alphabet;
  for (const auto& [w, n] : word_counts) {
    const std::vector<size_t> offsets = code_point_offsets(w);
    if (too_long(offsets)) continue;
    for (size_t k = 0; k + 1 < offsets.size(); ++k)
      alphabet.insert((k == 0 ? "" : std::string(kContinuation)) +
                      w.substr(offsets[k], offsets[k + 1] - offsets[k]));
  }
  std::vector<std::string> vocab{std::string(kPadToken), std::string(kUnkToken),
                                 std::string(kClsToken), std::string(kSepToken),
                                 std::string(kMaskToken)};
  const int64_t minimum = static_cast<int64_t>(vocab.size() + alphabet.size());
  KILN_CHECK(options.vocab_size >= minimum,
             "train_wordpiece: vocab_size {} cannot hold the 5 special tokens and the corpus's "
             "alphabet of {} (characters as word starts and as ## continuations): need at least {}",
             options.vocab_size, alphabet.size(), minimum);
  vocab.insert(vocab.end(), alphabet.begin(), alphabet.end());
  std::unordered_map<std::string, int32_t> symbol_ids;
  for (size_t i = 0; i < vocab.size(); ++i) symbol_ids.emplace(vocab[i], static_cast<int32_t>(i));

  // Each distinct word as a sequence of symbols (vocabulary ids), with its count.
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [w, n] : word_counts) {
    const std::vector<size_t> offsets = code_point_offsets(w);
    if (too_long(offsets)) continue;
    std::vector<int32_t> symbols;
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      const std::string c = w.substr(offsets[k], offsets[k + 1] - offsets[k]);
      symbols.push_back(symbol_ids.at(k == 0 ? c : std::string(kContinuation) + c));
    }
    words.push_back(std::move(symbols));
    freq.push_back(n);
  }

  using Pair = uint64_t;
  const auto make_pair = [](int32_t a, int32_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  };
  const auto left = [](Pair p) { return static_cast<int32_t>(p >> 32); };
  const auto right = [](Pair p) { return static_cast<int32_t>(p & 0xFFFFFFFFu); };
  std::unordered_map<Pair, int64_t> pair_counts;
  std::unordered_map<Pair, std::vector<int32_t>> where;  // words holding a pair (may be stale)
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t k = 0; k + 1 < words[w].size(); ++k) {
      const Pair p = make_pair(words[w][k], words[w][k + 1]);
      pair_counts[p] += freq[w];
      std::vector<int32_t>& list = where[p];
      if (list.empty() || list.back() != static_cast<int32_t>(w))
        list.push_back(static_cast<int32_t>(w));
    }

  // Most frequent first; equal counts by the pair's strings. Entries go stale as counts
  // fall and are checked when they reach the top (counts of a pair only fall, except when
  // it is new, and then it is pushed afresh).
  struct Entry {
    int64_t count;
    Pair pair;
  };
  const auto worse = [&](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    const std::string &xl = vocab[left(x.pair)], &yl = vocab[left(y.pair)];
    if (xl != yl) return xl > yl;
    return vocab[right(x.pair)] > vocab[right(y.pair)];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (const auto& [p, n] : pair_counts) heap.push({n, p});

  std::vector<int64_t> visited(words.size(), -1);
  std::unordered_map<Pair, int64_t> delta;
  for (int64_t merge = 0;
       static_cast<int64_t>(vocab.size()) < options.vocab_size && !heap.empty();) {
    const Entry top = heap.top();
    heap.pop();
    const auto it = pair_counts.find(top.pair);
    const int64_t count = it == pair_counts.end() ? 0 : it->second;
    if (count != top.count) {
      if (count > 0) heap.push({count, top.pair});
      continue;
    }
    if (count < options.min_frequency) break;
    const int32_t a = left(top.pair), b = right(top.pair);
    std::string merged = vocab[a];
    merged.append(vocab[b], kContinuation.size());  // b is always a continuation piece
    auto [sym, added] = symbol_ids.emplace(merged, static_cast<int32_t>(vocab.size()));
    if (added) vocab.push_back(std::move(merged));
    const int32_t c = sym->second;

    delta.clear();
    std::vector<int32_t> holders = std::move(where[top.pair]);
    where.erase(top.pair);
    for (int32_t w : holders) {
      if (visited[w] == merge) continue;
      visited[w] = merge;
      std::vector<int32_t>& s = words[w];
      for (size_t k = 0; k + 1 < s.size(); ++k) delta[make_pair(s[k], s[k + 1])] -= freq[w];
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t k = 0; k < s.size(); ++k) {
        if (k + 1 < s.size() && s[k] == a && s[k + 1] == b) {
          next.push_back(c);
          ++k;
        } else {
          next.push_back(s[k]);
        }
      }
      s = std::move(next);
      for (size_t k = 0; k + 1 < s.size(); ++k) {
        const Pair p = make_pair(s[k], s[k + 1]);
        delta[p] += freq[w];
        if (s[k] == c || s[k + 1] == c) where[p].push_back(w);
      }
    }
    for (const auto& [p, d] : delta) {
      if (d == 0) continue;
      int64_t& n = pair_counts[p];
      n += d;
      if (n == 0)
        pair_counts.erase(p);
      else if (d > 0)
        heap.push({n, p});
    }
    ++merge;
  }
  return vocab;
}

}  // namespace kiln::data
