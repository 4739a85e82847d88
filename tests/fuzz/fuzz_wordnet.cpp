// libFuzzer target: the WordNet data-file parser (data/wordnet.cpp). The first byte picks
// the part of speech; the rest is the file. Any input either parses or throws kiln::Error;
// what parses has lexicographer files in range and non-empty glosses and words.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "data/wordnet.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const char pos = "nvar"[data[0] % 4];
  kiln::fuzz::write_input("data.pos", data + 1, size - 1);
  try {
    for (const kiln::data::WordnetSynset& s :
         kiln::data::read_wordnet_file(kiln::fuzz::scratch_folder() / "data.pos", pos)) {
      if (s.lex_file < 0 || s.lex_file >= kiln::data::kWordnetLexFiles || s.gloss.empty() ||
          s.words.empty())
        std::abort();
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
