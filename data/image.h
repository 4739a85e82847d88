#pragma once
// Image: 8-bit pixels as a JPEG decoder produces them, rows top to bottom with the channels
// of a pixel next to each other (HWC). Transforms work on Images; a data set turns the
// final Image into an f32 [C, H, W] tensor (to_tensor), so that cropping and resizing
// touch bytes, not floats.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace kiln::data {

// The largest image, in pixels (height * width), that decode_jpeg decodes and that the
// transforms (resize, crops) produce. A corrupt or hostile file can claim 65500x65500 in a
// 4 KB header, and resizing a 65500x1 strip to a shorter side of 512 asks for 17 G pixels:
// both become a kiln::Error naming the limit instead of gigabytes of memory. The default,
// 2^27 = 134,217,728 pixels (16384x8192; 384 MiB as RGB), is far above any photo data set
// and between PIL's warning (89 M pixels) and error (179 M) thresholds.
inline constexpr int64_t kDefaultMaxImagePixels = int64_t{1} << 27;
// The limit in force for the whole process (kDefaultMaxImagePixels until set).
int64_t max_image_pixels();
// Sets the limit (>= 1) for the whole process: every later decode and transform, in every
// thread, checks against it.
void set_max_image_pixels(int64_t pixels);
// What check_image_size throws for an image over the limit: a property of one image (its
// header, or what a transform would make of its shape), so a data set reports it as a bad
// sample that --skip-bad-images may skip, unlike an error in the pipeline's settings.
class ImageTooLarge : public Error {
 public:
  using Error::Error;
};
// Throws ImageTooLarge, starting with `what` (an op and, where there is one, a file), when
// an image of height x width is larger than max_image_pixels(); a kiln::Error for a
// negative side.
void check_image_size(int64_t height, int64_t width, std::string_view what);

struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // 1 (grey) or 3 (RGB)
  std::vector<uint8_t> pixels;  // height * width * channels bytes

  Image() = default;
  // A black image of the given size (at most max_image_pixels()).
  Image(int64_t height, int64_t width, int64_t channels);

  uint8_t* at(int64_t y, int64_t x) { return pixels.data() + (y * width + x) * channels; }
  const uint8_t* at(int64_t y, int64_t x) const { return pixels.data() + (y * width + x) * channels; }
};

// Decodes a JPEG held in memory (libjpeg-turbo). `name` (a file's path, usually) goes into
// the kiln::Error thrown for data that is not a valid JPEG: a bad header, a size above
// max_image_pixels() (refused before any pixel memory is allocated), truncated data, or any
// of libjpeg's "corrupt data" warnings (bad Huffman codes, premature end of a data segment,
// extraneous bytes, ...), which libjpeg itself would decode past into grey or garbled
// pixels. Grey JPEGs stay 1-channel; everything else (RGB, YCbCr, CMYK) comes out as RGB.
Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name);
// Reads and decodes a JPEG file; an unreadable or corrupt file, or a path that is not a
// regular file (a FIFO is refused without blocking), is a kiln::Error naming it.
Image read_jpeg(const std::filesystem::path& path);
// Encodes an 1- or 3-channel image as a baseline JPEG of the given quality (1..100).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);
// Writes encode_jpeg(image) to path through a temporary file and a rename, so a reader
// never sees half a file.
void write_jpeg(const std::filesystem::path& path, const Image& image, int quality = 90);

// f32 [channels, height, width] with values pixel / 255 in [0, 1].
Tensor to_tensor(const Image& image);

}  // namespace kiln::data
