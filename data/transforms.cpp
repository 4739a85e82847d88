#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace kiln::data {

namespace {

void check_image(const Image& image, const char* op) {
  KILN_CHECK(image.height > 0 && image.width > 0 && (image.channels == 1 || image.channels == 3) &&
                 static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
             "{}: bad image {}x{}x{} holding {} bytes", op, image.height, image.width, image.channels,
             image.pixels.size());
}

// Where output index i samples the input, for bilinear resizing of `in` pixels to `out`.
struct Tap {
  int64_t low, high;  // the two input pixels
  float weight;       // of `high`
};

// Half-pixel centres (output pixel i covers input [i, i+1) * in / out, sampled at its
// centre), clamped at the borders, without antialiasing: the same taps as
// torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False),
// i.e. torchvision's resize with antialias=False. Shrinking by more than 2x therefore
// skips pixels (aliases), which the recipes here (224 crops of ~400-pixel photos) tolerate.
std::vector<Tap> bilinear_taps(int64_t in, int64_t out) {
  std::vector<Tap> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t i = 0; i < out; ++i) {
    const double source = std::max(0.0, (static_cast<double>(i) + 0.5) * scale - 0.5);
    const auto low = std::min(static_cast<int64_t>(source), in - 1);
    taps[static_cast<size_t>(i)] = {low, std::min(low + 1, in - 1), static_cast<float>(source - static_cast<double>(low))};
  }
  return taps;
}

// Resizes the region [top, top + height) x [left, left + width) of `image` to out_height x
// out_width, bilinearly. An output above max_image_pixels() is an error naming `op`.
Image resize_region(const char* op, const Image& image, int64_t top, int64_t left, int64_t height,
                    int64_t width, int64_t out_height, int64_t out_width) {
  check_image_size(out_height, out_width, op);
  const int64_t channels = image.channels;
  Image out(out_height, out_width, channels);
  if (height == out_height && width == out_width) {  // a plain crop
    const auto row_bytes = static_cast<size_t>(width * channels);
    for (int64_t y = 0; y < height; ++y) std::memcpy(out.at(y, 0), image.at(top + y, left), row_bytes);
    return out;
  }
  const std::vector<Tap> rows = bilinear_taps(height, out_height);
  const std::vector<Tap> columns = bilinear_taps(width, out_width);
  // Input byte offsets of each output column's two taps, within a row.
  std::vector<int64_t> low_offset(static_cast<size_t>(out_width)), high_offset(static_cast<size_t>(out_width));
  for (size_t x = 0; x < columns.size(); ++x) {
    low_offset[x] = (left + columns[x].low) * channels;
    high_offset[x] = (left + columns[x].high) * channels;
  }
  const int64_t stride = image.width * channels;
  uint8_t* q = out.pixels.data();
  for (const Tap& row : rows) {
    const uint8_t* upper = image.pixels.data() + (top + row.low) * stride;
    const uint8_t* lower = image.pixels.data() + (top + row.high) * stride;
    const float wy = row.weight;
    for (size_t x = 0; x < columns.size(); ++x) {
      const float wx = columns[x].weight;
      const uint8_t *a = upper + low_offset[x], *b = upper + high_offset[x];
      const uint8_t *c = lower + low_offset[x], *d = lower + high_offset[x];
      for (int64_t k = 0; k < channels; ++k) {
        const float top_value = static_cast<float>(a[k]) + wx * static_cast<float>(b[k] - a[k]);
        const float bottom_value = static_cast<float>(c[k]) + wx * static_cast<float>(d[k] - c[k]);
        const float value = top_value + wy * (bottom_value - top_value);
        *q++ = static_cast<uint8_t>(std::clamp(value + 0.5f, 0.0f, 255.0f));
      }
    }
  }
  return out;
}

// round(twice / 2) for twice >= 0 with halves going to the even neighbour, as Python's
// round() in torchvision's center_crop does.
int64_t half_rounded_to_even(int64_t twice) {
  const int64_t floor_half = twice / 2;
  return twice % 2 == 0 || floor_half % 2 == 0 ? floor_half : floor_half + 1;
}

}  // namespace

ImageTransform resize(int64_t height, int64_t width) {
  KILN_CHECK(height > 0 && width > 0, "resize: target size {}x{} must be positive", height, width);
  return [height, width](const Image& image, SampleRng&) {
    check_image(image, "resize");
    return resize_region("resize", image, 0, 0, image.height, image.width, height, width);
  };
}

ImageTransform resize(int64_t size) {
  KILN_CHECK(size > 0, "resize: shorter side {} must be positive", size);
  return [size](const Image& image, SampleRng&) {
    check_image(image, "resize");
    // The longer side is truncated, as torchvision does: int(size * long / short). A long
    // thin image gives a huge longer side (65500x1 to a shorter side of 512: 33.5 M pixels
    // wide), which resize_region refuses against max_image_pixels().
    const int64_t shorter = std::min(image.height, image.width), longer = std::max(image.height, image.width);
    int64_t scaled = 0;
    if (__builtin_mul_overflow(size, longer, &scaled))
      fail("resize: a {}x{} image with its shorter side resized to {} has too many pixels (limit {}, "
           "data::set_max_image_pixels)",
           image.height, image.width, size, max_image_pixels());
    const int64_t long_side = std::max<int64_t>(1, scaled / shorter);
    const int64_t height = image.height < image.width ? size : long_side;
    const int64_t width = image.height < image.width ? long_side : size;
    return resize_region("resize", image, 0, 0, image.height, image.width, height, width);
  };
}

ImageTransform center_crop(int64_t size) {
  KILN_CHECK(size > 0, "center_crop: size {} must be positive", size);
  return [size](const Image& image, SampleRng&) {
    check_image(image, "center_crop");
    check_image_size(size, size, "center_crop");
    // Input row of output row 0: torchvision's int(round((h - size) / 2)) when the image is
    // larger, and -(size - h) // 2 (its left/top padding) when smaller.
    const auto origin = [size](int64_t extent) {
      return extent >= size ? half_rounded_to_even(extent - size) : -((size - extent) / 2);
    };
    const int64_t top = origin(image.height), left = origin(image.width);
    Image out(size, size, image.channels);
    const int64_t x_begin = std::max<int64_t>(0, -left), x_end = std::min(size, image.width - left);
    const auto row_bytes = static_cast<size_t>((x_end - x_begin) * image.channels);
    for (int64_t y = std::max<int64_t>(0, -top); y < std::min(size, image.height - top); ++y)
      std::memcpy(out.at(y, x_begin), image.at(top + y, left + x_begin), row_bytes);
    return out;
  };
}

ImageTransform random_horizontal_flip(double p) {
  KILN_CHECK(p >= 0 && p <= 1, "random_horizontal_flip: probability {} outside [0, 1]", p);
  return [p](const Image& image, SampleRng& rng) {
    check_image(image, "random_horizontal_flip");
    if (!(rng.uniform() < p)) return image;
    Image out(image.height, image.width, image.channels);
    const int64_t channels = image.channels;
    for (int64_t y = 0; y < image.height; ++y) {
      const uint8_t* in = image.at(y, image.width - 1);
      uint8_t* q = out.at(y, 0);
      for (int64_t x = 0; x < image.width; ++x, in -= channels, q += channels)
        for (int64_t k = 0; k < channels; ++k) q[k] = in[k];
    }
    return out;
  };
}

ImageTransform random_resized_crop(int64_t size, std::pair<double, double> scale, std::pair<double, double> ratio) {
  KILN_CHECK(size > 0, "random_resized_crop: size {} must be positive", size);
  KILN_CHECK(scale.first > 0 && scale.first <= scale.second && scale.second <= 1,
             "random_resized_crop: scale ({}, {}) must satisfy 0 < low <= high <= 1", scale.first, scale.second);
  KILN_CHECK(ratio.first > 0 && ratio.first <= ratio.second,
             "random_resized_crop: ratio ({}, {}) must satisfy 0 < low <= high", ratio.first, ratio.second);
  return [size, scale, ratio](const Image& image, SampleRng& rng) {
    check_image(image, "random_resized_crop");
    const int64_t height = image.height, width = image.width;
    const double area = static_cast<double>(height * width);
    const double log_low = std::log(ratio.first), log_high = std::log(ratio.second);
    // torchvision's RandomResizedCrop.get_params, draw for draw.
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target_area = area * rng.uniform(scale.first, scale.second);
      const double aspect = std::exp(rng.uniform(log_low, log_high));
      const auto crop_width = static_cast<int64_t>(std::lround(std::sqrt(target_area * aspect)));
      const auto crop_height = static_cast<int64_t>(std::lround(std::sqrt(target_area / aspect)));
      if (crop_width > 0 && crop_width <= width && crop_height > 0 && crop_height <= height) {
        const auto top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - crop_height + 1)));
        const auto left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - crop_width + 1)));
        return resize_region("random_resized_crop", image, top, left, crop_height, crop_width, size, size);
      }
    }
    // Fallback: the largest central crop whose aspect ratio is within `ratio`.
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    int64_t crop_width = width, crop_height = height;
    if (in_ratio < ratio.first)
      crop_height = std::clamp<int64_t>(std::lround(static_cast<double>(width) / ratio.first), 1, height);
    else if (in_ratio > ratio.second)
      crop_width = std::clamp<int64_t>(std::lround(static_cast<double>(height) * ratio.second), 1, width);
    return resize_region("random_resized_crop", image, (height - crop_height) / 2, (width - crop_width) / 2,
                         crop_height, crop_width, size, size);
  };
}

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
