// libFuzzer target: the JPEG decoder (data/image.cpp, over libjpeg-turbo) and the image
// transforms (data/transforms.cpp) on what it decodes. Any input either decodes or throws
// kiln::Error; a decoded image has the bytes its size says and goes through the transforms.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "data/image.h"
#include "data/transforms.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A 16-byte header can claim 65500x65500: keep each decode under a megabyte.
  kiln::data::set_max_image_pixels(int64_t{1} << 18);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::data;
  Image image;
  try {
    image = decode_jpeg(std::span<const uint8_t>(data, size), "fuzz.jpg");
  } catch (const kiln::Error&) {
    return 0;
  }
  if (image.height < 1 || image.width < 1 || (image.channels != 1 && image.channels != 3) ||
      image.pixels.size() != static_cast<size_t>(image.height * image.width * image.channels))
    std::abort();
  SampleRng rng(1, 2, 3);
  const Transforms transforms{
      .steps = {random_resized_crop(5), random_horizontal_flip(), center_crop(4)},
      .mean = {0.5f},
      .std = {0.25f}};
  transforms(image, rng);
  to_tensor(resize(2, 7)(image, rng));
  // A long thin image may resize to more pixels than the limit: that is a kiln::Error too.
  try {
    resize(3)(image, rng);
  } catch (const kiln::Error&) {
  }
  return 0;
}
