// JPEG decoding and encoding (libjpeg-turbo): round trips of smooth grey and RGB images,
// write_jpeg/read_jpeg through a file, and errors naming the data for garbage, truncated
// and empty data, a missing file and bad encoder arguments; to_tensor's layout.
//
// Tolerances (8-bit levels): a smooth image encoded at quality 95 comes back with a mean
// absolute error under 1 and a largest error under 4 (libjpeg-turbo 2.1 gives 0 and 0 for
// grey, 0.67 and 1 for RGB, whose chroma is subsampled); through a file, mean under 1.5;
// to_tensor is exact to 1e-7.
#include "testing.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/image.h"

using namespace kiln;
using namespace kiln::data;

namespace {

// A fresh folder under the system temporary folder, removed at the end of the test.
struct TempFolder {
  std::filesystem::path path;
  TempFolder() {
    std::random_device device;
    path = std::filesystem::temp_directory_path() / ("kiln-test-image-" + std::to_string(device()));
    std::filesystem::create_directories(path);
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// The message of the kiln::Error that f throws, or a note that it threw none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no kiln::Error thrown)";
}

// Smooth gradients, different in each channel.
Image smooth_image(int64_t height, int64_t width, int64_t channels) {
  Image image(height, width, channels);
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < channels; ++c)
        image.at(y, x)[c] = static_cast<uint8_t>(30 + 2 * x + 2 * y + 40 * c);
  return image;
}

// A noisy image, so that its JPEG is large enough to cut in the middle of the pixel data.
Image noisy_image(int64_t size) {
  Image image(size, size, 3);
  std::mt19937 generator(7);
  for (uint8_t& byte : image.pixels) byte = static_cast<uint8_t>(generator());
  return image;
}

struct Errors {
  double mean = 0, max = 0;
};

Errors difference(const Image& a, const Image& b) {
  Errors errors;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const double d = std::abs(static_cast<double>(a.pixels[i]) - static_cast<double>(b.pixels[i]));
    errors.mean += d;
    errors.max = std::max(errors.max, d);
  }
  errors.mean /= static_cast<double>(a.pixels.size());
  return errors;
}

}  // namespace

TEST_CASE("encode_jpeg then decode_jpeg keeps a smooth grey or RGB image", "[images]") {
  const int64_t channels = GENERATE(1, 3);
  const Image image = smooth_image(24, 40, channels);
  const std::vector<uint8_t> bytes = encode_jpeg(image, 95);
  REQUIRE(bytes.size() > 100);
  CHECK(bytes[0] == 0xFF);
  CHECK(bytes[1] == 0xD8);  // the SOI marker
  const Image decoded = decode_jpeg(bytes, "smooth");
  REQUIRE(decoded.height == 24);
  REQUIRE(decoded.width == 40);
  REQUIRE(decoded.channels == channels);
  const Errors errors = difference(image, decoded);
  INFO("mean error " << errors.mean << ", largest " << errors.max);
  CHECK(errors.mean < 1.0);
  CHECK(errors.max < 4);
}

TEST_CASE("write_jpeg and read_jpeg go through a file and leave no temporary behind", "[images]") {
  TempFolder folder;
  const std::filesystem::path path = folder.path / "picture.jpg";
  const Image image = smooth_image(16, 16, 3);
  write_jpeg(path, image, 95);
  const Image decoded = read_jpeg(path);
  REQUIRE(decoded.pixels.size() == image.pixels.size());
  CHECK(difference(image, decoded).mean < 1.5);
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(folder.path)) ++entries;
  CHECK(entries == 1);
  // Overwriting an existing file works too.
  write_jpeg(path, smooth_image(8, 8, 1));
  CHECK(read_jpeg(path).channels == 1);
}

TEST_CASE("decode_jpeg of garbage or empty data throws naming the data", "[images]") {
  std::vector<uint8_t> garbage(300);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  CHECK_THAT(error_of([&] { decode_jpeg(garbage, "garbage.jpg"); }), Catch::Contains("garbage.jpg"));
  CHECK_THAT(error_of([&] { decode_jpeg({}, "empty.jpg"); }), Catch::Contains("empty.jpg"));
  // A JPEG's start followed by garbage.
  std::vector<uint8_t> bad_header = encode_jpeg(smooth_image(8, 8, 3));
  for (size_t i = 4; i < bad_header.size(); ++i) bad_header[i] = 0x55;
  CHECK_THAT(error_of([&] { decode_jpeg(bad_header, "bad-header.jpg"); }), Catch::Contains("bad-header.jpg"));
}

TEST_CASE("decode_jpeg of a truncated JPEG throws naming it", "[images]") {
  const std::vector<uint8_t> bytes = encode_jpeg(noisy_image(64), 90);
  REQUIRE(bytes.size() > 4000);
  for (const size_t kept : {bytes.size() / 2, bytes.size() - 10, size_t{30}}) {
    INFO("kept " << kept << " of " << bytes.size() << " bytes");
    const std::span<const uint8_t> head(bytes.data(), kept);
    CHECK_THAT(error_of([&] { decode_jpeg(head, "cut.jpg"); }), Catch::Contains("cut.jpg"));
  }
  CHECK_THAT(error_of([&] { decode_jpeg(std::span<const uint8_t>(bytes.data(), bytes.size() / 2), "cut.jpg"); }),
             Catch::Contains("Premature end"));
}

TEST_CASE("read_jpeg of a missing or corrupt file throws naming it", "[images]") {
  TempFolder folder;
  const std::filesystem::path missing = folder.path / "no-such-image.jpg";
  const std::string message = error_of([&] { read_jpeg(missing); });
  CHECK_THAT(message, Catch::Contains(missing.string()));
  CHECK_THAT(message, Catch::Contains("read_jpeg"));
  const std::filesystem::path corrupt = folder.path / "corrupt.jpg";
  std::ofstream(corrupt) << "this is not a JPEG";
  CHECK_THAT(error_of([&] { read_jpeg(corrupt); }), Catch::Contains(corrupt.string()));
  CHECK_THAT(error_of([&] { read_jpeg(folder.path); }), Catch::Contains(folder.path.string()));
}

TEST_CASE("encode_jpeg rejects bad images and qualities", "[images]") {
  CHECK_THAT(error_of([] { encode_jpeg(smooth_image(4, 4, 3), 0); }), Catch::Contains("quality 0"));
  CHECK_THAT(error_of([] { encode_jpeg(smooth_image(4, 4, 3), 101); }), Catch::Contains("quality 101"));
  CHECK_THAT(error_of([] { encode_jpeg(Image(0, 4, 3)); }), Catch::Contains("encode_jpeg"));
  Image wrong_channels = smooth_image(4, 4, 3);
  wrong_channels.channels = 2;
  CHECK_THAT(error_of([&] { encode_jpeg(wrong_channels); }), Catch::Contains("2 channels"));
  Image short_pixels = smooth_image(4, 4, 3);
  short_pixels.pixels.pop_back();
  CHECK_THAT(error_of([&] { encode_jpeg(short_pixels); }), Catch::Contains("47 bytes"));
  CHECK_THAT(error_of([] { write_jpeg("/nonexistent-folder-kiln/x.jpg", smooth_image(4, 4, 1)); }),
             Catch::Contains("/nonexistent-folder-kiln/x.jpg"));
}

TEST_CASE("to_tensor lays out channels first and scales by 1 over 255", "[images]") {
  Image image(1, 2, 3);
  image.pixels = {0, 51, 255, 102, 153, 204};
  const Tensor t = to_tensor(image);
  KILN_CHECK_CLOSE(t, testing::f32s({0, 102 / 255.f, 51 / 255.f, 153 / 255.f, 1, 204 / 255.f}, {3, 1, 2}), 0, 1e-7);
}
