#pragma once
// What a kiln-train run trains on (tools/trainer.cpp's run): its data sets, from images or
// from text with the run's WordPiece vocabulary, and the weights --init starts a model
// from. make_model and make_text_model, in tools/trainer.h, are defined beside them.
#include <filesystem>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/wordpiece.h"
#include "models/module.h"
#include "tools/trainer.h"

namespace kiln::train {

struct DataSets {
  std::shared_ptr<const data::Dataset> train, val;  // val null when the data has no split
};

// The image data sets of config.data (synthetic, fashion-mnist, shapes, a folder), each cut
// to --train-samples / --val-samples evenly spaced samples.
DataSets make_data(const Config& config);

// The transformers' data: WordNet's glosses (the training glosses for pretraining, their
// lexicographer files for classify, the held-out glosses to validate) or a text file's
// documents (every tenth held out), tokenized with the run's vocabulary: --vocab, a resumed
// run's own, the one beside --init's weights, or one trained on the training text.
// `tokenizer` and `vocab_source` (the file, or how it was trained) are set.
DataSets make_text_data(const Config& config, std::shared_ptr<const data::WordPiece>& tokenizer,
                        std::string& vocab_source);

// --init's weights file: the file itself, a step folder's model.safetensors, or the latest
// checkpoint's of a checkpoint folder. kiln::Error when there is none.
std::filesystem::path init_weights_file(const std::filesystem::path& init);

// Loads the tensors of `file` that `model` has (by name: kiln's names are Hugging Face's);
// the model's others keep their fresh initialization (a new head), as Hugging Face's
// from_pretrained does. Returns one line saying what it loaded, what starts fresh and what
// of the file went unused; kiln::Error when no name matches.
std::string load_init(nn::Module& model, const std::filesystem::path& file);

}  // namespace kiln::train
