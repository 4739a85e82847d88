// WordPiece: basic tokenization (punctuation, accents, case, CJK, control characters, bad
// UTF-8), the greedy longest-match split on a hand-made vocabulary, encode and decode,
// vocab.txt reading and writing, and the trainer's merges on Sennrich's tiny corpus.
#include <filesystem>
#include <fstream>
#include <random>

#include "data/wordpiece.h"
#include "testing.h"

using namespace kiln;
using data::WordPiece;
using data::WordPieceOptions;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> hand_vocab() {
  return {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]", "the",  "quick", "fox", "un",
          "##aff", "##able", ",",     ".",     "!",      "cafe", "jump",  "##s", "##ed",
          "naive", "hello",  "world", "日",    "本",     "u",    "##n"};
}

std::vector<std::string> words_of(const WordPiece& wp, const std::vector<int64_t>& ids) {
  std::vector<std::string> out;
  for (int64_t id : ids) out.push_back(wp.token(id));
  return out;
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() /
         fmt::format("kiln-test-wordpiece-{}-{}", std::random_device{}(), name);
}

}  // namespace

TEST_CASE("basic tokenization splits punctuation, lower-cases and strips accents", "[wordpiece]") {
  const WordPieceOptions uncased;
  CHECK(data::basic_tokenize("Hello, World!  Café\tnaïve\n", uncased) ==
        std::vector<std::string>{"hello", ",", "world", "!", "cafe", "naive"});
  CHECK(data::basic_tokenize("ÀÉÎÕÜ Ångström Łódź", uncased) ==
        std::vector<std::string>{"aeiou", "angstrom", "łodz"});  // Ł has no decomposition
  CHECK(data::basic_tokenize("don't (re-)use $5", uncased) ==
        std::vector<std::string>{"don", "'", "t", "(", "re", "-", ")", "use", "$", "5"});
  // Greek and Cyrillic (what Hugging Face's BertWordPieceTokenizer gives for these).
  CHECK(data::basic_tokenize("ΑΒΓ Δέλτα Ύψος Привет Ёлка Йод ΟΔΟΣ ǅ", uncased) ==
        std::vector<std::string>{"αβγ", "δελτα", "υψος", "привет", "елка", "иод", "οδοσ", "ǆ"});
  // A combining accent after the letter is dropped too (the NFD form of "é").
  CHECK(data::basic_tokenize("cafe\xcc\x81", uncased) == std::vector<std::string>{"cafe"});
  const WordPieceOptions cased{.lower_case = false, .strip_accents = false};
  CHECK(data::basic_tokenize("Café, naïve", cased) ==
        std::vector<std::string>{"Café", ",", "naïve"});
}

TEST_CASE("basic tokenization: CJK characters are words, controls dropped, odd spaces split",
          "[wordpiece]") {
  const WordPieceOptions uncased;
  CHECK(data::basic_tokenize("日本x語", uncased) ==
        std::vector<std::string>{"日", "本", "x", "語"});
  CHECK(data::basic_tokenize(std::string("a\x01") + "b\xe2\x80\x8b" + "c", uncased) ==
        std::vector<std::string>{"abc"});  // U+0001 and the zero-width space U+200B
  CHECK(data::basic_tokenize("a\xc2\xa0"
                             "b\xe3\x80\x80"
                             "c",
                             uncased) ==
        std::vector<std::string>{"a", "b", "c"});  // no-break and ideographic spaces
  CHECK(data::basic_tokenize("\xe2\x80\x9cquoted\xe2\x80\x9d", uncased) ==
        std::vector<std::string>{"\xe2\x80\x9c", "quoted", "\xe2\x80\x9d"});  // curly quotes
  CHECK(data::basic_tokenize("", uncased).empty());
  CHECK(data::basic_tokenize(" \t\n", uncased).empty());
}

TEST_CASE("basic tokenization refuses invalid UTF-8", "[wordpiece]") {
  const WordPieceOptions uncased;
  CHECK_THROWS_WITH(data::basic_tokenize("ab\xff", uncased),
                    Catch::Contains("invalid UTF-8") && Catch::Contains("offset 2"));
  CHECK_THROWS_WITH(data::basic_tokenize("a\xc3", uncased), Catch::Contains("invalid UTF-8"));
  CHECK_THROWS_WITH(data::basic_tokenize("\xc0\xaf", uncased), Catch::Contains("overlong"));
  CHECK_THROWS_WITH(data::basic_tokenize("\xed\xa0\x80", uncased), Catch::Contains("surrogate"));
}

TEST_CASE("WordPiece splits words greedily, longest piece first, [UNK] for the rest",
          "[wordpiece]") {
  const WordPiece wp(hand_vocab());
  CHECK(wp.vocab_size() == 25);
  CHECK(words_of(wp, wp.tokenize("Unaffable fox jumps!")) ==
        std::vector<std::string>{"un", "##aff", "##able", "fox", "jump", "##s", "!"});
  // "un" is preferred over "u" + "##n": the longest match from the left.
  CHECK(words_of(wp, wp.tokenize("un")) == std::vector<std::string>{"un"});
  // A word with no complete split is one [UNK], not a partial split.
  CHECK(words_of(wp, wp.tokenize("jumpz the xyz")) ==
        std::vector<std::string>{"[UNK]", "the", "[UNK]"});
  CHECK(words_of(wp, wp.tokenize("Café naïve 日本")) ==
        std::vector<std::string>{"cafe", "naive", "日", "本"});
  CHECK(wp.encode("the fox") == std::vector<int64_t>{wp.cls_id(), 5, 7, wp.sep_id()});
  CHECK(words_of(wp, wp.encode("Hello", "world.")) ==
        std::vector<std::string>{"[CLS]", "hello", "[SEP]", "world", ".", "[SEP]"});
  CHECK(wp.encode("") == std::vector<int64_t>{wp.cls_id(), wp.sep_id()});
}

TEST_CASE("WordPiece: words longer than max_chars_per_word are [UNK]", "[wordpiece]") {
  const WordPiece wp(hand_vocab(), {.max_chars_per_word = 5});
  // "jumps" has 5 characters, "unaffable" 9; "naïve" counts characters, not bytes (6 bytes).
  CHECK(words_of(wp, wp.tokenize("jumps unaffable")) ==
        std::vector<std::string>{"jump", "##s", "[UNK]"});
  const WordPiece cased(hand_vocab(),
                        {.lower_case = false, .strip_accents = false, .max_chars_per_word = 5});
  CHECK(cased.tokenize("naïve") ==
        std::vector<int64_t>{cased.unk_id()});  // in range, but not in the vocabulary
  CHECK_THROWS_WITH(WordPiece(hand_vocab(), {.max_chars_per_word = 0}),
                    Catch::Contains("max_chars_per_word 0"));
}

TEST_CASE("WordPiece decodes ids back to text", "[wordpiece]") {
  const WordPiece wp(hand_vocab());
  CHECK(wp.decode(wp.encode("Unaffable fox, jumps.")) == "unaffable fox , jumps .");
  CHECK(wp.decode({2, 8, 9, 3}, true) == "[CLS] unaff [SEP]");
  CHECK_THROWS_WITH(wp.decode({5, 25}), Catch::Contains("id 25 outside the vocabulary [0, 25)"));
  CHECK_THROWS_WITH(wp.decode({-1}), Catch::Contains("id -1"));
}

TEST_CASE("WordPiece vocabularies: specials required, no duplicates, vocab.txt round trip",
          "[wordpiece]") {
  std::vector<std::string> no_mask = hand_vocab();
  no_mask.erase(no_mask.begin() + 4);
  CHECK_THROWS_WITH(WordPiece(no_mask), Catch::Contains("lacks the special token [MASK]"));
  std::vector<std::string> twice = hand_vocab();
  twice.push_back("fox");
  CHECK_THROWS_WITH(WordPiece(twice),
                    Catch::Contains("'fox' is in the vocabulary twice (ids 7 and 25)"));

  const fs::path path = temp_file("vocab.txt");
  const WordPiece wp(hand_vocab());
  wp.save(path);
  const WordPiece back = WordPiece::load(path);
  CHECK(back.tokens() == wp.tokens());
  CHECK(back.find("##aff") == 9);
  CHECK(back.find("nope") == -1);

  {
    std::ofstream out(path, std::ios::binary);
    out << "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nfox\r\n";  // Windows line ends
  }
  CHECK(WordPiece::load(path).find("fox") == 5);
  {
    std::ofstream out(path, std::ios::binary);
    out << "[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n";
  }
  CHECK_THROWS_WITH(WordPiece::load(path), Catch::Contains("line 3 is empty"));
  fs::remove(path);
  CHECK_THROWS_WITH(WordPiece::load(path), Catch::Contains("WordPiece: cannot open"));
}

// Sennrich et al.'s example: low x5, lower x2, newest x6, widest x3. Pair counts: ##e ##s
// and ##s ##t 9 each (tie: "##e" < "##s"), then ##es ##t 9; ##o ##w and l ##o 7 (tie:
// "##o" < "l"); then low; then the 6s of newest by their left strings, "##e" < "##ew" <
// "n"; then the 3s of widest ("##d" < "##i" < "w"); last the 2s of lower.
TEST_CASE("the WordPiece trainer merges the most frequent pairs, ties by their strings",
          "[wordpiece]") {
  std::vector<std::string> corpus;
  for (int i = 0; i < 5; ++i) corpus.push_back("low");
  for (int i = 0; i < 2; ++i) corpus.push_back("Lower");
  for (int i = 0; i < 6; ++i) corpus.push_back("newest");
  for (int i = 0; i < 3; ++i) corpus.push_back("widest");
  const std::vector<std::string> merges{"##es",   "##est",  "##ow",    "low",    "##ew", "##ewest",
                                        "newest", "##dest", "##idest", "widest", "##er", "lower"};
  // Word starts l, n, w; continuations the rest ("#" sorts before the letters).
  const std::vector<std::string> alphabet{"##d", "##e", "##i", "##o", "##r", "##s",
                                          "##t", "##w", "l",   "n",   "w"};

  const std::vector<std::string> vocab =
      data::train_wordpiece(corpus, {.vocab_size = 1000, .min_frequency = 1});
  REQUIRE(vocab.size() == 5 + alphabet.size() + merges.size());
  CHECK(std::vector<std::string>(vocab.begin(), vocab.begin() + 5) ==
        std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"});
  CHECK(std::vector<std::string>(vocab.begin() + 5, vocab.begin() + 16) == alphabet);
  CHECK(std::vector<std::string>(vocab.begin() + 16, vocab.end()) == merges);

  // The same corpus in another order gives the same vocabulary.
  std::vector<std::string> shuffled = corpus;
  std::mt19937 gen(7);
  std::shuffle(shuffled.begin(), shuffled.end(), gen);
  CHECK(data::train_wordpiece(shuffled, {.vocab_size = 1000, .min_frequency = 1}) == vocab);

  // vocab_size and min_frequency stop the merges early.
  const auto four = data::train_wordpiece(corpus, {.vocab_size = 20, .min_frequency = 1});
  CHECK(std::vector<std::string>(four.begin() + 16, four.end()) ==
        std::vector<std::string>(merges.begin(), merges.begin() + 4));
  CHECK(data::train_wordpiece(corpus, {.vocab_size = 1000, .min_frequency = 3}).size() == 16 + 10);

  // A trained vocabulary tokenizes unseen words from its pieces.
  const WordPiece wp(vocab);
  // "," never occurs, and "s" never starts a word: both [UNK].
  CHECK(
      words_of(wp, wp.tokenize("lowest, newer wow slow")) ==
      std::vector<std::string>{"low", "##est", "[UNK]", "n", "##ew", "##er", "w", "##ow", "[UNK]"});

  CHECK_THROWS_WITH(
      data::train_wordpiece(corpus, {.vocab_size = 15}),
      Catch::Contains("vocab_size 15 cannot hold") && Catch::Contains("need at least 16"));
  CHECK_THROWS_WITH(data::train_wordpiece(corpus, {.min_frequency = 0}),
                    Catch::Contains("min_frequency 0"));
}
