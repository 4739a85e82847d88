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

#include "core/fifo_testing.h"
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

namespace {

// Sets the process-wide pixel limit for one test and restores the previous one.
struct PixelLimit {
  int64_t previous = max_image_pixels();
  explicit PixelLimit(int64_t pixels) { set_max_image_pixels(pixels); }
  ~PixelLimit() { set_max_image_pixels(previous); }
};

// `jpeg` with the frame header (SOF0) changed to claim height x width.
std::vector<uint8_t> with_claimed_size(std::vector<uint8_t> jpeg, uint16_t height, uint16_t width) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {  // FF C0, length (2), precision (1), height, width
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8), jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8), jpeg[i + 8] = static_cast<uint8_t>(width);
      return jpeg;
    }
  }
  FAIL("no SOF0 marker");
  return jpeg;
}

// Where the entropy-coded data of `jpeg` starts: just past the start-of-scan segment.
size_t scan_data_start(const std::vector<uint8_t>& jpeg) {
  for (size_t i = 2; i + 3 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA) return i + 2 + (size_t{jpeg[i + 2]} << 8 | jpeg[i + 3]);
  FAIL("no SOS marker");
  return 0;
}

}  // namespace

TEST_CASE("decode_jpeg refuses a header claiming more pixels than the limit", "[images]") {
  // A 4 KB file whose header claims 20000x20000 used to decode "fine" into gigabytes.
  const std::vector<uint8_t> small = encode_jpeg(noisy_image(64), 90);
  const std::vector<uint8_t> huge = with_claimed_size(small, 20000, 20000);
  REQUIRE(huge.size() < 20000);
  const std::string message = error_of([&] { decode_jpeg(huge, "huge.jpg"); });
  CHECK_THAT(message, Catch::Contains("decode_jpeg: huge.jpg") && Catch::Contains("20000x20000") &&
                          Catch::Contains(fmt::format("limit of {} pixels", kDefaultMaxImagePixels)));
  // The limit is the caller's to choose.
  PixelLimit limit(64 * 63);
  CHECK_THAT(error_of([&] { decode_jpeg(small, "small.jpg"); }),
             Catch::Contains("small.jpg") && Catch::Contains("64x64") && Catch::Contains("limit of 4032 pixels"));
  set_max_image_pixels(64 * 64);
  CHECK(decode_jpeg(small, "small.jpg").height == 64);
  CHECK_THAT(error_of([] { set_max_image_pixels(0); }), Catch::Contains("set_max_image_pixels"));
}

TEST_CASE("decode_jpeg refuses corrupt entropy-coded data", "[images]") {
  // libjpeg only warns ("Corrupt JPEG data: ...") and decodes garbage; those warnings are
  // errors now.
  const std::vector<uint8_t> good = encode_jpeg(noisy_image(64), 90);
  const size_t start = scan_data_start(good);
  REQUIRE(start + 200 < good.size());
  // A marker in the middle of the scan: "premature end of data segment".
  std::vector<uint8_t> marker = good;
  marker[start + 100] = 0xFF, marker[start + 101] = 0xD5;
  CHECK_THAT(error_of([&] { decode_jpeg(marker, "marker.jpg"); }),
             Catch::Contains("marker.jpg") && Catch::Contains("Corrupt JPEG data"));
  // Stray bytes between the scan and the end-of-image marker: "extraneous bytes".
  std::vector<uint8_t> extra = good;
  extra.insert(extra.end() - 2, {0x12, 0x34, 0x56});
  CHECK_THAT(error_of([&] { decode_jpeg(extra, "extra.jpg"); }),
             Catch::Contains("extra.jpg") && Catch::Contains("Corrupt JPEG data"));
  // Bytes of the scan overwritten: "bad Huffman code", or a hit marker, however it lands.
  std::vector<uint8_t> garbled = good;
  for (size_t i = start + 50; i < good.size() - 2; ++i) garbled[i] = 0xFF;
  CHECK_THAT(error_of([&] { decode_jpeg(garbled, "garbled.jpg"); }), Catch::Contains("garbled.jpg"));
}

TEST_CASE("read_jpeg refuses a FIFO without blocking", "[images]") {
  TempFolder folder;
  testing::Fifo fifo(folder.path / "image.jpg");
  CHECK_THAT(error_of([&] { read_jpeg(fifo.path()); }),
             Catch::Contains("read_jpeg") && Catch::Contains(fifo.path().string()) &&
                 Catch::Contains("not a regular file (a FIFO)"));
}

TEST_CASE("Image refuses sizes above the pixel limit", "[images]") {
  CHECK_THAT(error_of([] { Image(int64_t{1} << 20, int64_t{1} << 20, 3); }),
             Catch::Contains("Image") && Catch::Contains("1048576x1048576") && Catch::Contains("limit"));
  CHECK_THAT(error_of([] { Image(int64_t{1} << 40, int64_t{1} << 40, 1); }), Catch::Contains("too many"));
}
