#include "data/wordnet.h"

#include <charconv>
#include <string_view>

#include "core/error.h"
#include "core/regular_file.h"

namespace kiln::data {

namespace {

namespace fs = std::filesystem;

// The fields of one data-file line, read left to right; errors name the file and line.
class LineFields {
 public:
  LineFields(std::string_view line, const fs::path& file, int64_t line_number)
      : line_(line), file_(file), line_number_(line_number) {}

  std::string_view next(const char* what) {
    while (pos_ < line_.size() && line_[pos_] == ' ') ++pos_;
    const size_t start = pos_;
    while (pos_ < line_.size() && line_[pos_] != ' ') ++pos_;
    if (start == pos_) error("the line ends before {}", what);
    return line_.substr(start, pos_ - start);
  }

  // A number in base `base` with exactly `digits` digits (0: any count).
  uint64_t number(const char* what, int base, size_t digits = 0) {
    const std::string_view field = next(what);
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value, base);
    if (ec != std::errc() || end != field.data() + field.size() ||
        (digits != 0 && field.size() != digits))
      error("{} '{}' should be {}{} digits", what, field,
            digits == 0 ? "" : std::to_string(digits) + " ",
            base == 16 ? "hexadecimal" : "decimal");
    return value;
  }

  // The rest of the line after the field just read, without surrounding spaces.
  std::string_view rest() const {
    std::string_view r = line_.substr(pos_);
    while (!r.empty() && r.front() == ' ') r.remove_prefix(1);
    while (!r.empty() && (r.back() == ' ' || r.back() == '\r')) r.remove_suffix(1);
    return r;
  }

  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("wordnet: {}:{}: {}", file_.string(), line_number_,
         fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  std::string_view line_;
  const fs::path& file_;
  int64_t line_number_;
  size_t pos_ = 0;
};

// One synset line: offset lex_filenum ss_type w_cnt [word lex_id]... p_cnt [ptr offset pos
// source/target]... [f_cnt [+ f_num w_num]...] | gloss (WordNet's wndb(5WN)).
WordnetSynset parse_synset(std::string_view line, const fs::path& file, int64_t line_number,
                           char file_pos) {
  LineFields f(line, file, line_number);
  WordnetSynset s;
  s.file_pos = file_pos;
  s.offset = static_cast<uint32_t>(f.number("the synset offset", 10, 8));
  s.lex_file = static_cast<int64_t>(f.number("the lexicographer file number", 10, 2));
  if (s.lex_file >= kWordnetLexFiles)
    f.error("lexicographer file number {} is outside [0, {})", s.lex_file, kWordnetLexFiles);
  const std::string_view type = f.next("the synset type");
  if (type.size() != 1 || std::string_view("nvasr").find(type[0]) == std::string_view::npos)
    f.error("synset type '{}' is not one of n, v, a, s, r", type);
  s.ss_type = type[0];
  const bool type_fits =
      file_pos == 'a' ? (s.ss_type == 'a' || s.ss_type == 's') : s.ss_type == file_pos;
  if (!type_fits)
    f.error("synset type '{}' in the data file of part of speech '{}'", s.ss_type, file_pos);
  const uint64_t words = f.number("the word count", 16, 2);
  if (words == 0) f.error("the synset has no words");
  for (uint64_t w = 0; w < words; ++w) {
    std::string word(f.next("a word"));
    // Adjectives may carry a syntactic marker: "(p)", "(a)" or "(ip)".
    if (const size_t paren = word.find('('); paren != std::string::npos && word.back() == ')')
      word.resize(paren);
    s.words.push_back(std::move(word));
    f.number("a word's lex_id", 16, 1);
  }
  const uint64_t pointers = f.number("the pointer count", 10, 3);
  for (uint64_t p = 0; p < pointers; ++p) {
    f.next("a pointer symbol");
    f.number("a pointer's synset offset", 10, 8);
    const std::string_view pos = f.next("a pointer's part of speech");
    if (pos.size() != 1 || std::string_view("nvasr").find(pos[0]) == std::string_view::npos)
      f.error("pointer part of speech '{}' is not one of n, v, a, s, r", pos);
    f.number("a pointer's source/target field", 16, 4);
  }
  if (s.ss_type == 'v') {
    const uint64_t frames = f.number("the verb frame count", 10, 2);
    for (uint64_t k = 0; k < frames; ++k) {
      if (f.next("a verb frame's '+'") != "+") f.error("a verb frame does not start with '+'");
      f.number("a verb frame number", 10, 2);
      f.number("a verb frame's word number", 16, 2);
    }
  }
  if (f.next("the gloss separator '|'") != "|")
    f.error("the fields are not followed by ' | ' and the gloss");
  s.gloss = std::string(f.rest());
  if (s.gloss.empty()) f.error("the gloss is empty");
  return s;
}

// SplitMix64's finalizer: a fixed, well-mixed hash of the synset's identity.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const std::vector<std::string>& wordnet_lex_names() {
  static const std::vector<std::string> names{
      "adj.all",          "adj.pert",           "adv.all",
      "noun.Tops",        "noun.act",           "noun.animal",
      "noun.artifact",    "noun.attribute",     "noun.body",
      "noun.cognition",   "noun.communication", "noun.event",
      "noun.feeling",     "noun.food",          "noun.group",
      "noun.location",    "noun.motive",        "noun.object",
      "noun.person",      "noun.phenomenon",    "noun.plant",
      "noun.possession",  "noun.process",       "noun.quantity",
      "noun.relation",    "noun.shape",         "noun.state",
      "noun.substance",   "noun.time",          "verb.body",
      "verb.change",      "verb.cognition",     "verb.communication",
      "verb.competition", "verb.consumption",   "verb.contact",
      "verb.creation",    "verb.emotion",       "verb.motion",
      "verb.perception",  "verb.possession",    "verb.social",
      "verb.stative",     "verb.weather",       "adj.ppl"};
  return names;
}

std::vector<WordnetSynset> read_wordnet_file(const fs::path& file, char file_pos) {
  KILN_CHECK(std::string_view("nvar").find(file_pos) != std::string_view::npos,
             "wordnet: part of speech '{}' for {} is not one of n, v, a, r", file_pos,
             file.string());
  const RegularFile regular(file, "wordnet");
  std::string text(static_cast<size_t>(regular.size()), '\0');
  regular.read_at(text.data(), text.size(), 0);
  std::vector<WordnetSynset> synsets;
  int64_t line_number = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    ++line_number;
    pos = end + 1;
    if (line.starts_with("  ") || line.empty()) continue;  // the license header
    synsets.push_back(parse_synset(line, file, line_number, file_pos));
  }
  return synsets;
}

std::vector<WordnetSynset> read_wordnet(const fs::path& dir) {
  std::vector<WordnetSynset> all;
  for (const auto& [name, pos] :
       {std::pair{"data.noun", 'n'}, {"data.verb", 'v'}, {"data.adj", 'a'}, {"data.adv", 'r'}}) {
    const fs::path file = dir / name;
    std::error_code ec;
    KILN_CHECK(
        fs::is_regular_file(file, ec),
        "wordnet: {} is missing: WordNet's data files come from Debian's wordnet-base package "
        "(apt-get install wordnet-base, or third_party/install-deps.sh)",
        file.string());
    std::vector<WordnetSynset> part = read_wordnet_file(file, pos);
    KILN_CHECK(!part.empty(), "wordnet: {} holds no synsets", file.string());
    all.insert(all.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return all;
}

bool wordnet_in_split(const WordnetSynset& synset, Split split) {
  const bool held_out =
      mix((static_cast<uint64_t>(synset.file_pos) << 32) | synset.offset) % 10 == 0;
  return held_out == (split == Split::test);
}

TextTask wordnet_lex_task(const std::vector<WordnetSynset>& synsets, Split split) {
  TextTask task;
  task.class_names = wordnet_lex_names();
  for (const WordnetSynset& s : synsets) {
    if (!wordnet_in_split(s, split)) continue;
    task.texts.push_back(s.gloss);
    task.labels.push_back(s.lex_file);
  }
  return task;
}

std::vector<std::string> wordnet_corpus(const std::vector<WordnetSynset>& synsets, Split split) {
  std::vector<std::string> docs;
  for (const WordnetSynset& s : synsets)
    if (wordnet_in_split(s, split)) docs.push_back(s.gloss);
  return docs;
}

}  // namespace kiln::data
