#pragma once
// Dataset: numbered samples, each an input tensor and a class label. The loader
// (data/loader.h) batches them. Implementations must let several threads call get() at
// once.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "data/sample_rng.h"

namespace kiln::data {

struct Sample {
  Tensor input;       // f32 [C, H, W] for the image data sets
  int64_t label = 0;  // the class, 0 <= label < num_classes()
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
  // The shape of every get(i).input, e.g. [3, 224, 224].
  virtual std::vector<int64_t> sample_shape() const = 0;
  // Sample `index` (0 <= index < size(), else kiln::Error). `rng` is this sample's own
  // random stream for random transforms. Safe to call from several threads.
  virtual Sample get(int64_t index, SampleRng& rng) const = 0;
  // One line for logs: "fashion-mnist train: 60000 samples, 10 classes, [1, 28, 28]".
  virtual std::string describe() const = 0;
};

}  // namespace kiln::data
