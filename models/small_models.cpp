// MLP and SmallCNN.
#include "models/small_models.h"

#include <string>

#include "core/error.h"

namespace kiln::models {

namespace {

std::string sizes_str(const std::vector<int64_t>& sizes) {
  std::string out = "{";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "}";
}

// SmallCNN's checks run before any member is built, so a bad option fails with its name.
SmallCNNOptions checked(SmallCNNOptions o) {
  KILN_CHECK(o.in_channels > 0 && o.num_classes > 0 && o.channels1 > 0 && o.channels2 > 0,
             "SmallCNN: in_channels ({}), num_classes ({}), channels1 ({}) and channels2 ({}) "
             "must be positive",
             o.in_channels, o.num_classes, o.channels1, o.channels2);
  KILN_CHECK(o.image_size >= 4,
             "SmallCNN: image_size must be at least 4 (two 2x2 poolings), got {}", o.image_size);
  return o;
}

nn::Conv2d conv3x3(int64_t in_channels, int64_t out_channels) {
  return nn::Conv2d(in_channels, out_channels, 3, {.padding = 1, .bias = false});
}

}  // namespace

MLP::MLP(const std::vector<int64_t>& sizes) {
  KILN_CHECK(sizes.size() >= 2, "MLP: needs at least an input and an output size, got {}",
             sizes_str(sizes));
  for (int64_t s : sizes) {
    KILN_CHECK(s > 0, "MLP: every size must be positive, got {}", sizes_str(sizes));
  }
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) push_back(nn::ReLU());
    push_back(nn::Linear(sizes[i], sizes[i + 1]));
  }
}

SmallCNN::SmallCNN(SmallCNNOptions options)
    : options_(checked(options)),
      features_(
          add("features",
              nn::Sequential(conv3x3(options_.in_channels, options_.channels1),
                             nn::BatchNorm2d(options_.channels1), nn::ReLU(), nn::MaxPool2d(2),
                             conv3x3(options_.channels1, options_.channels2),
                             nn::BatchNorm2d(options_.channels2), nn::ReLU(), nn::MaxPool2d(2)))),
      fc_(add("fc",
              nn::Linear(options_.channels2 * (options_.image_size / 4) * (options_.image_size / 4),
                         options_.num_classes))) {}

Tensor SmallCNN::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.shape()[1] == options_.in_channels &&
                 x.shape()[2] == options_.image_size && x.shape()[3] == options_.image_size,
             "SmallCNN: expected input [N, {}, {}, {}], got {} {}", options_.in_channels,
             options_.image_size, options_.image_size, shape_str(x.shape()), x.dtype());
  return fc_(features_(x).flatten(1));
}

ConvNet::ConvNet(ConvNetOptions options) {
  KILN_CHECK(options.in_channels > 0 && options.num_classes > 0 && !options.widths.empty(),
             "ConvNet: in_channels ({}) and num_classes ({}) must be positive and widths {} not empty",
             options.in_channels, options.num_classes, sizes_str(options.widths));
  int64_t in = options.in_channels;
  for (size_t i = 0; i < options.widths.size(); ++i) {
    const int64_t out = options.widths[i];
    KILN_CHECK(out > 0, "ConvNet: widths {} must be positive", sizes_str(options.widths));
    if (i > 0) push_back(nn::MaxPool2d(2));
    push_back(conv3x3(in, out));
    push_back(nn::BatchNorm2d(out));
    push_back(nn::ReLU());
    in = out;
  }
  push_back(nn::AdaptiveAvgPool2d(1));
  push_back(nn::Flatten());
  push_back(nn::Linear(in, options.num_classes));
}

}  // namespace kiln::models
