#pragma once
// Image transforms, torchvision's training and evaluation recipes:
//
//   data::Transforms train{.steps = {data::random_resized_crop(224), data::random_horizontal_flip()},
//                          .mean = data::kImageNetMean, .std = data::kImageNetStd};
//   data::Transforms eval{.steps = {data::resize(256), data::center_crop(224)},
//                         .mean = data::kImageNetMean, .std = data::kImageNetStd};
//
// Random transforms draw from the sample's SampleRng only, so they are reproducible. Every
// transform refuses, with a kiln::Error naming it and the sizes, to make an image larger
// than max_image_pixels() (data/image.h).
#include <functional>
#include <utility>
#include <vector>

#include "data/image.h"
#include "data/sample_rng.h"

namespace kiln::data {

using ImageTransform = std::function<Image(const Image&, SampleRng&)>;

// Crops a random area (a fraction in `scale` of the image, aspect ratio in `ratio`, drawn
// log-uniformly) and resizes it to size x size (bilinear); falls back to a centre crop
// after 10 failed draws, as torchvision does.
ImageTransform random_resized_crop(int64_t size, std::pair<double, double> scale = {0.08, 1.0},
                                   std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
// Mirrors the image left-right with probability p.
ImageTransform random_horizontal_flip(double p = 0.5);
// Resizes (bilinear) so that the shorter side is `size`, keeping the aspect ratio.
ImageTransform resize(int64_t size);
// Resizes (bilinear) to exactly height x width.
ImageTransform resize(int64_t height, int64_t width);
// Cuts the central size x size square (padding with black when the image is smaller).
ImageTransform center_crop(int64_t size);

inline const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

// The steps in order, then to_tensor, then Normalize ((x - mean[c]) / std[c]) when mean
// and std are given (one value per channel, or one for all channels).
struct Transforms {
  std::vector<ImageTransform> steps;
  std::vector<float> mean;
  std::vector<float> std;

  // f32 [C, H, W]. Throws kiln::Error when mean/std do not match the channel count.
  Tensor operator()(const Image& image, SampleRng& rng) const;
};

}  // namespace kiln::data
