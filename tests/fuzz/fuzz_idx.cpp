// libFuzzer target: the IDX reader of Fashion-MNIST (data/fashion_mnist.cpp). The input is
// split into an images file and a labels file (its first 4 bytes, little-endian, give the
// images file's length); either file may be gzip-compressed. Any input either loads or
// throws kiln::Error; the samples of what loads are read, with and without transforms.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "data/datasets.h"
#include "data/image.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Keeps a claimed 65536x65536 image from costing a 4 GB allocation per input.
  kiln::data::set_max_image_pixels(int64_t{1} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  uint32_t images_size = 0;
  std::memcpy(&images_size, data, 4);
  const bool transformed = images_size >> 31;
  images_size &= 0x7FFFFFFF;
  data += 4, size -= 4;
  const size_t split = std::min<size_t>(images_size, size);
  kiln::fuzz::write_input("train-images-idx3-ubyte", data, split);
  kiln::fuzz::write_input("train-labels-idx1-ubyte", data + split, size - split);
  try {
    std::optional<kiln::data::Transforms> transforms;
    if (transformed) transforms = kiln::data::Transforms{.steps = {kiln::data::resize(3)}};
    const kiln::data::FashionMnist set(kiln::fuzz::scratch_folder(), kiln::data::Split::train,
                                       transforms);
    for (int64_t i = 0; i < std::min<int64_t>(set.size(), 3); ++i) {
      kiln::data::SampleRng rng(0, 0, static_cast<uint64_t>(i));
      set.get(i, rng);
    }
    set.describe();
  } catch (const kiln::Error&) {
  }
  return 0;
}
