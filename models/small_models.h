#pragma once
// Small models for tests and examples: a multilayer perceptron and a two-stage CNN.
#include <cstdint>
#include <vector>

#include "models/layers.h"

namespace kiln::models {

// Linear layers of the given sizes with ReLU between them (none after the last):
// MLP({2, 8, 1}) is Sequential(Linear(2, 8), ReLU(), Linear(8, 1)), children "0", "1", "2".
class MLP : public nn::Sequential {
 public:
  // Needs at least two sizes, all positive.
  explicit MLP(const std::vector<int64_t>& sizes);
};

struct SmallCNNOptions {
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  int64_t image_size = 28;  // square inputs [N, in_channels, image_size, image_size]
  int64_t channels1 = 8;    // channels of the first stage
  int64_t channels2 = 16;   // channels of the second stage
};

// features: (3x3 conv, BatchNorm, ReLU, 2x2 max pool) twice, children "0".."7"; then
// flatten and fc (Linear) to num_classes logits. forward maps [N, in_channels, S, S] to
// [N, num_classes].
class SmallCNN : public nn::Module {
 public:
  explicit SmallCNN(SmallCNNOptions options = {});
  Tensor forward(const Tensor& x) override;
  nn::Sequential features() const { return features_; }
  nn::Linear fc() const { return fc_; }

 private:
  SmallCNNOptions options_;
  nn::Sequential features_;
  nn::Linear fc_;
};

struct ConvNetOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  std::vector<int64_t> widths = {16, 32, 64, 128};  // channels of each stage
};

// A plain VGG-style net that sees whole objects: per stage a 3x3 conv, BatchNorm and ReLU,
// with a 2x2 max pool between stages; then global average pooling and a linear classifier,
// so it takes any image size of at least 2^(stages-1). Children "0".. of a Sequential.
// kiln-train's --arch cnn.
class ConvNet : public nn::Sequential {
 public:
  explicit ConvNet(ConvNetOptions options = {});
};

}  // namespace kiln::models
