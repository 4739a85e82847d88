// WordNet's data files: the parser on hand-written files in the format (tests/data/wordnet)
// and on malformed lines, the split, and, where Debian's wordnet-base is installed, the
// real files (WordNet 3.0's synset counts, 45 lexicographer files, a one-in-ten split).
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "data/wordnet.h"
#include "testing.h"

using namespace kiln;
using data::Split;
using data::WordnetSynset;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "wordnet";

// A data file holding the license-style header line and then `line`.
struct OneLineFile {
  fs::path path;
  explicit OneLineFile(const std::string& line) {
    path = fs::temp_directory_path() / fmt::format("kiln-test-wordnet-{}", std::random_device{}());
    std::ofstream out(path);
    out << "  1 header  \n" << line << "  \n";
  }
  ~OneLineFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

}  // namespace

TEST_CASE("WordNet data files: synsets parsed, the license header skipped", "[wordnet]") {
  const std::vector<WordnetSynset> nouns = data::read_wordnet_file(kFixture / "data.noun", 'n');
  REQUIRE(nouns.size() == 4);
  CHECK(nouns[0].offset == 100);
  CHECK(nouns[0].lex_file == 5);
  CHECK(nouns[0].ss_type == 'n');
  CHECK(nouns[0].words == std::vector<std::string>{"kiln_cat", "test_cat"});
  CHECK(nouns[0].gloss == "a small animal invented for a test; \"the kiln_cat slept\"");
  CHECK(nouns[2].gloss == "a chamber for baking or firing; \"fire the pots in the oven\"");

  const std::vector<WordnetSynset> verbs = data::read_wordnet_file(kFixture / "data.verb", 'v');
  REQUIRE(verbs.size() == 2);  // the verb frames ("02 + 08 00 + 11 01") are read past
  CHECK(verbs[0].gloss == "bake in a kiln; \"fire the clay\"");
  CHECK(verbs[1].words == std::vector<std::string>{"run", "hurry"});
  CHECK(verbs[1].lex_file == 38);

  const std::vector<WordnetSynset> adjectives = data::read_wordnet_file(kFixture / "data.adj", 'a');
  REQUIRE(adjectives.size() == 3);
  CHECK(adjectives[1].ss_type == 's');
  CHECK(adjectives[1].words == std::vector<std::string>{"warm", "toasty"});  // "(p)" removed
  CHECK(adjectives[2].lex_file == 44);
  CHECK(adjectives[2].gloss == "(of pottery) baked in a kiln");

  const std::vector<WordnetSynset> all = data::read_wordnet(kFixture);
  REQUIRE(all.size() == 11);
  CHECK(all[4].file_pos == 'v');
  CHECK(all[9].file_pos == 'r');
  CHECK(all[9].gloss == "at a slow pace; \"cool the kiln slowly\"");

  const auto& names = data::wordnet_lex_names();
  REQUIRE(names.size() == 45);
  CHECK(names[0] == "adj.all");
  CHECK(names[5] == "noun.animal");
  CHECK(names[38] == "verb.motion");
  CHECK(names[44] == "adj.ppl");
}

TEST_CASE("WordNet data files: a malformed line is an error naming the file and line",
          "[wordnet]") {
  const auto refuse = [](const std::string& line, char pos, const std::string& message) {
    INFO(line);
    const OneLineFile file(line);
    CHECK_THROWS_WITH(data::read_wordnet_file(file.path, pos),
                      Catch::Contains(file.path.string() + ":2: ") && Catch::Contains(message));
  };
  refuse("00000100 45 n 01 x 0 000 | g", 'n', "lexicographer file number 45 is outside [0, 45)");
  refuse("00000100 05 n 01 x 0 000 g", 'n', "not followed by ' | ' and the gloss");
  refuse("00000100 05 n 0g x 0 000 | g", 'n', "the word count '0g' should be 2 hexadecimal digits");
  refuse("00000100 05 n 01 x 0 001 @ 00000200 | g", 'n',
         "pointer part of speech '|' is not one of n, v, a, s, r");
  refuse("00000100 30 v 01 fire 0 000 | g", 'v',
         "the verb frame count '|' should be 2 decimal digits");
  refuse("00000100 05 v 01 x 0 000 | g", 'n',
         "synset type 'v' in the data file of part of speech 'n'");
  refuse("00000100 05 n 01 x 0 000 |", 'n', "the gloss is empty");
  refuse("100 05 n 01 x 0 000 | g", 'n', "the synset offset '100' should be 8 decimal digits");
  refuse("00000100 05 n 01", 'n', "the line ends before a word");
  CHECK_THROWS_WITH(data::read_wordnet_file(kFixture / "data.noun", 'x'), Catch::Contains("'x'"));
}

TEST_CASE("WordNet: a missing folder names the package to install", "[wordnet]") {
  CHECK_THROWS_WITH(data::read_wordnet("/nonexistent/wordnet"),
                    Catch::Contains("/nonexistent/wordnet/data.noun is missing") &&
                        Catch::Contains("wordnet-base"));
}

TEST_CASE("WordNet: the corpus and the task split the synsets in two", "[wordnet]") {
  const std::vector<WordnetSynset> all = data::read_wordnet(kFixture);
  const data::TextTask train = data::wordnet_lex_task(all, Split::train);
  const data::TextTask val = data::wordnet_lex_task(all, Split::test);
  CHECK(train.texts.size() + val.texts.size() == all.size());
  // The hash holds out noun 00001400 and adverb 00000800 (computed once, by hand).
  CHECK(val.texts ==
        std::vector<std::string>{"a furnace for firing or drying pottery; \"load the kiln\"",
                                 "in a hot manner"});
  CHECK(val.labels == std::vector<int64_t>{17, 2});
  CHECK(train.class_names.size() == 45);
  std::set<std::string> seen(train.texts.begin(), train.texts.end());
  for (const std::string& t : val.texts) CHECK(seen.count(t) == 0);
  CHECK(data::wordnet_corpus(all, Split::train) == train.texts);
  // The split depends on the synset alone: the same synset from another list, same answer.
  for (const WordnetSynset& s : all)
    CHECK(data::wordnet_in_split(s, Split::train) ==
          data::wordnet_in_split(WordnetSynset(s), Split::train));
}

// WordNet 3.0's published counts: 82,115 noun, 13,767 verb, 18,156 adjective (satellites
// included) and 3,621 adverb synsets.
TEST_CASE("WordNet: the installed data files (wordnet-base)", "[wordnet]") {
  if (!fs::exists(data::kWordnetDir / "data.noun")) {
    WARN("skipped: " << data::kWordnetDir.string() << " is missing (apt-get install wordnet-base)");
    return;
  }
  const std::vector<WordnetSynset> all = data::read_wordnet();
  std::map<char, int64_t> per_pos;
  std::vector<int64_t> per_label(45, 0);
  int64_t held_out = 0;
  for (const WordnetSynset& s : all) {
    ++per_pos[s.file_pos];
    ++per_label[static_cast<size_t>(s.lex_file)];
    held_out += data::wordnet_in_split(s, Split::test) ? 1 : 0;
  }
  CHECK(per_pos['n'] == 82115);
  CHECK(per_pos['v'] == 13767);
  CHECK(per_pos['a'] == 18156);
  CHECK(per_pos['r'] == 3621);
  for (size_t k = 0; k < per_label.size(); ++k) {
    INFO(data::wordnet_lex_names()[k]);
    CHECK(per_label[k] > 0);  // all 45 lexicographer files are used
  }
  // A hash that splits like a fair one-in-ten coin: held_out ~ Binomial(n, 0.1), sd =
  // sqrt(n * 0.1 * 0.9) ~ 103 for n = 117,659; five sd allowed.
  const auto n = static_cast<double>(all.size());
  CHECK(std::abs(static_cast<double>(held_out) - 0.1 * n) <= 5 * std::sqrt(n * 0.1 * 0.9));
}
