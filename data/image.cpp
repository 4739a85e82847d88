#include "data/image.h"

#include "core/error.h"
#include "core/ops/factory.h"

namespace kiln::data {

Image::Image(int64_t height, int64_t width, int64_t channels)
    : height(height), width(width), channels(channels) {
  KILN_CHECK(height >= 0 && width >= 0 && (channels == 1 || channels == 3),
             "Image: bad size {}x{}x{} (channels must be 1 or 3)", height, width, channels);
  pixels.assign(static_cast<size_t>(height * width * channels), 0);
}

Tensor to_tensor(const Image& image) {
  KILN_CHECK(static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
             "to_tensor: image of {}x{}x{} holds {} bytes", image.height, image.width, image.channels,
             image.pixels.size());
  Tensor t = empty({image.channels, image.height, image.width});
  float* out = t.data_ptr<float>();
  const int64_t plane = image.height * image.width;
  const uint8_t* in = image.pixels.data();
  for (int64_t c = 0; c < image.channels; ++c)
    for (int64_t i = 0; i < plane; ++i) out[c * plane + i] = in[i * image.channels + c] * (1.0f / 255.0f);
  return t;
}

}  // namespace kiln::data
