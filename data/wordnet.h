#pragma once
// WordNet 3.0 as a text corpus and a labelled task, read from the data files of Debian's
// wordnet-base package (/usr/share/wordnet/data.noun, data.verb, data.adj, data.adv).
// Each synset gives a gloss (its definition and usage examples) and its lexicographer file
// (45 classes: adj.all, noun.animal, verb.motion, ...). The corpus is the glosses; the task
// is gloss -> lexicographer file. A synset is held out (Split::test, the validation part)
// when a hash of its part of speech and offset says so, one synset in ten on average, so
// the split never changes with the reading order or the machine.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "data/text.h"

namespace kiln::data {

inline const std::filesystem::path kWordnetDir = "/usr/share/wordnet";
inline constexpr int64_t kWordnetLexFiles = 45;

struct WordnetSynset {
  char file_pos = 'n';             // the data file: 'n' noun, 'v' verb, 'a' adjective, 'r' adverb
  char ss_type = 'n';              // n, v, a, s (adjective satellite), r
  uint32_t offset = 0;             // the synset's byte offset in its data file: its id there
  int64_t lex_file = 0;            // 0 <= lex_file < kWordnetLexFiles, see wordnet_lex_names()
  std::vector<std::string> words;  // lemmas, "_" between words, adjective markers removed
  std::string gloss;               // definition and examples, as after the line's " | "
};

// The 45 lexicographer file names, indexed by number: "adj.all", "adj.pert", "adv.all",
// "noun.Tops", ..., "adj.ppl".
const std::vector<std::string>& wordnet_lex_names();

// Parses one WordNet data file (the lines starting with two spaces, the license, are
// skipped). `file_pos` is the file's part of speech ('n', 'v', 'a', 'r'). kiln::Error
// naming the file and line for a malformed line.
std::vector<WordnetSynset> read_wordnet_file(const std::filesystem::path& file, char file_pos);

// All synsets of data.noun, data.verb, data.adj and data.adv in `dir`, in that order.
// kiln::Error naming the folder and the package (wordnet-base) when a file is missing.
std::vector<WordnetSynset> read_wordnet(const std::filesystem::path& dir = kWordnetDir);

// Whether a synset belongs to `split`: Split::test (validation) for about one in ten,
// chosen by a hash of (file_pos, offset).
bool wordnet_in_split(const WordnetSynset& synset, Split split);

// The glosses of `split` labelled with their lexicographer file (45 classes).
TextTask wordnet_lex_task(const std::vector<WordnetSynset>& synsets, Split split);
// The glosses of `split` as documents, for pretraining (the training glosses by default,
// so that a model fine-tuned on the task has not read the validation glosses).
std::vector<std::string> wordnet_corpus(const std::vector<WordnetSynset>& synsets,
                                        Split split = Split::train);

}  // namespace kiln::data
