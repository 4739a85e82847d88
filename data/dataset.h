#pragma once
// Dataset: numbered samples, each an input tensor and a class label (or, for masked
// language modelling, a target per token). The loader (data/loader.h) batches them.
// Implementations must let several threads call get() at once.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "data/sample_rng.h"

namespace kiln::data {

// A per-token target that takes no part in the loss (PyTorch's ignore_index default).
inline constexpr int64_t kIgnoreIndex = -100;

struct Sample {
  Tensor input;       // f32 [C, H, W] for the image data sets; i64 [length] token ids for text
  int64_t label = 0;  // the class, 0 <= label < num_classes()
  // Optional, token sequences only: i64 [length], a target per token, each kIgnoreIndex or
  // in [0, num_classes()) (masked LM: the original token where one was masked). When set,
  // the batch's target is these instead of the labels.
  Tensor target;
};

// Thrown by Dataset::get for one sample that cannot be loaded (a corrupt or unreadable
// file); the message names the file. The loader skips and counts these when asked to.
class BadSample : public Error {
 public:
  using Error::Error;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  // The shape of every get(i).input, e.g. [3, 224, 224]; for token sequences [max_length].
  virtual std::vector<int64_t> sample_shape() const = 0;
  // Token-sequence data sets (data/text.h) return their padding token id: their samples are
  // i64 [length] with 1 <= length <= sample_shape()[0], and the loader pads each batch with
  // this id and gives a mask of the real tokens. Fixed-shape data sets return nullopt.
  virtual std::optional<int64_t> padding_id() const { return std::nullopt; }
  // Sample `index` (0 <= index < size(), else kiln::Error). `rng` is this sample's own
  // random stream for random transforms. Safe to call from several threads.
  virtual Sample get(int64_t index, SampleRng& rng) const = 0;
  // One line for logs: "fashion-mnist train: 60000 samples, 10 classes, [1, 28, 28]".
  virtual std::string describe() const = 0;
};

}  // namespace kiln::data
