#pragma once
// Image: 8-bit pixels as a JPEG decoder produces them, rows top to bottom with the channels
// of a pixel next to each other (HWC). Transforms work on Images; a data set turns the
// final Image into an f32 [C, H, W] tensor (to_tensor), so that cropping and resizing
// touch bytes, not floats.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::data {

struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // 1 (grey) or 3 (RGB)
  std::vector<uint8_t> pixels;  // height * width * channels bytes

  Image() = default;
  // A black image of the given size.
  Image(int64_t height, int64_t width, int64_t channels);

  uint8_t* at(int64_t y, int64_t x) { return pixels.data() + (y * width + x) * channels; }
  const uint8_t* at(int64_t y, int64_t x) const { return pixels.data() + (y * width + x) * channels; }
};

// Decodes a JPEG held in memory (libjpeg-turbo). `name` (a file's path, usually) goes into
// the kiln::Error thrown for data that is not a valid JPEG. Grey JPEGs stay 1-channel;
// everything else (RGB, YCbCr, CMYK) comes out as RGB.
Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name);
// Reads and decodes a JPEG file; an unreadable or corrupt file is a kiln::Error naming it.
Image read_jpeg(const std::filesystem::path& path);
// Encodes an 1- or 3-channel image as a baseline JPEG of the given quality (1..100).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);
// Writes encode_jpeg(image) to path through a temporary file and a rename, so a reader
// never sees half a file.
void write_jpeg(const std::filesystem::path& path, const Image& image, int quality = 90);

// f32 [channels, height, width] with values pixel / 255 in [0, 1].
Tensor to_tensor(const Image& image);

}  // namespace kiln::data
