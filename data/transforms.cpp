#include "data/transforms.h"

#include "core/error.h"

namespace kiln::data {

Tensor Transforms::operator()(const Image& image, SampleRng& rng) const {
  Image current = image;
  for (const ImageTransform& step : steps) current = step(current, rng);
  Tensor t = to_tensor(current);
  if (mean.empty() && std.empty()) return t;
  const auto channels = static_cast<size_t>(current.channels);
  KILN_CHECK(mean.size() == std.size() && (mean.size() == 1 || mean.size() == channels),
             "Normalize: {} means and {} stds for an image of {} channels", mean.size(), std.size(), channels);
  float* p = t.data_ptr<float>();
  const int64_t plane = current.height * current.width;
  for (size_t c = 0; c < channels; ++c) {
    const float m = mean[mean.size() == 1 ? 0 : c], s = std[std.size() == 1 ? 0 : c];
    KILN_CHECK(s > 0, "Normalize: std[{}] = {} must be positive", c, s);
    const float inv = 1.0f / s;
    float* q = p + static_cast<int64_t>(c) * plane;
    for (int64_t i = 0; i < plane; ++i) q[i] = (q[i] - m) * inv;
  }
  return t;
}

}  // namespace kiln::data
