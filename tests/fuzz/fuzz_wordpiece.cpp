// libFuzzer target: the WordPiece tokenizer (data/wordpiece.cpp). The first byte picks what
// the rest is: a vocab.txt to load (then a fixed text is encoded and decoded with it), a
// text to tokenize with a fixed vocabulary (cased and uncased), or a corpus to train a
// small vocabulary on. Any input either works or throws kiln::Error; every id an encode
// gives lies in the vocabulary, and a trained vocabulary loads as a WordPiece.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/wordpiece.h"
#include "fuzz_file.h"

namespace {

void check_ids(const kiln::data::WordPiece& wp, const std::vector<int64_t>& ids) {
  for (int64_t id : ids)
    if (id < 0 || id >= wp.vocab_size()) std::abort();
}

const kiln::data::WordPiece& fixed_vocab() {
  static const kiln::data::WordPiece wp(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "ab", "##a",
                               "##b", "##ab", "é", "##é", "日", ","});
  return wp;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (mode == 0) {
      kiln::fuzz::write_input("vocab.txt", data + 1, size - 1);
      const auto wp = kiln::data::WordPiece::load(kiln::fuzz::scratch_folder() / "vocab.txt",
                                                  {.max_chars_per_word = 8});
      const std::vector<int64_t> ids = wp.encode("ab, a日 café", "b");
      check_ids(wp, ids);
      wp.decode(ids, true);
    } else if (mode == 1) {
      for (const bool lower : {true, false}) {
        const kiln::data::WordPiece wp(
            fixed_vocab().tokens(),
            {.lower_case = lower, .strip_accents = lower, .max_chars_per_word = 6});
        const std::vector<int64_t> ids = wp.encode(rest);
        check_ids(wp, ids);
        wp.decode(ids);
      }
    } else {
      std::vector<std::string> documents;
      size_t start = 0;
      for (size_t i = 0; i <= rest.size(); ++i)
        if (i == rest.size() || rest[i] == '\n') {
          documents.emplace_back(rest.substr(start, i - start));
          start = i + 1;
        }
      const std::vector<std::string> vocab =
          kiln::data::train_wordpiece(documents, {.vocab_size = 300, .min_frequency = 1});
      const kiln::data::WordPiece wp(vocab);
      for (const std::string& d : documents) check_ids(wp, wp.encode(d));
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
