// Image transforms against hand-computed pixels: bilinear resize (half-pixel centres) up
// and down, shorter-side resize sizes, center_crop with and without padding, flips,
// random_resized_crop (sizes, determinism per seed, variety across seeds, the full-image
// and fallback crops), Transforms' normalization and its errors.
//
// Tolerances: pixels are compared exactly (the hand values are whole numbers, which the
// float arithmetic reaches exactly); normalized values to 1e-6.
#include "testing.h"

#include <set>
#include <string>
#include <vector>

#include "data/transforms.h"

using namespace kiln;
using namespace kiln::data;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no kiln::Error thrown)";
}

Image grey(int64_t height, int64_t width, const std::vector<int>& values) {
  Image image(height, width, 1);
  REQUIRE(values.size() == image.pixels.size());
  for (size_t i = 0; i < values.size(); ++i) image.pixels[i] = static_cast<uint8_t>(values[i]);
  return image;
}

std::vector<int> pixels_of(const Image& image) { return {image.pixels.begin(), image.pixels.end()}; }

// Pixel (y, x) = 10 y + x, so every pixel says where it came from.
Image coordinates(int64_t height, int64_t width) {
  Image image(height, width, 1);
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) image.at(y, x)[0] = static_cast<uint8_t>(10 * y + x);
  return image;
}

// An RGB image with distinct, varied pixels.
Image varied_rgb(int64_t height, int64_t width) {
  Image image(height, width, 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>((i * 97 + 13) % 256);
  return image;
}

}  // namespace

TEST_CASE("resize enlarges 2x2 to 4x4 bilinearly with half-pixel centres", "[images]") {
  SampleRng rng(0, 0, 0);
  // Output i samples input (i + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25
  // (clamped to 1): each row of [[0, 40], [80, 200]] becomes [a, a + (b-a)/4, a + 3(b-a)/4, b].
  const Image out = resize(4, 4)(grey(2, 2, {0, 40, 80, 200}), rng);
  REQUIRE(out.height == 4);
  REQUIRE(out.width == 4);
  CHECK(pixels_of(out) == std::vector<int>{0, 10, 30, 40,       //
                                           20, 35, 65, 80,      //
                                           60, 85, 135, 160,    //
                                           80, 110, 170, 200});
  // RGB channels are resized independently.
  Image rgb(2, 2, 3);
  const std::vector<int> values = {0, 40, 80, 200};
  for (size_t i = 0; i < 4; ++i) {
    rgb.pixels[3 * i] = static_cast<uint8_t>(values[i]);
    rgb.pixels[3 * i + 1] = static_cast<uint8_t>(255 - values[i]);
    rgb.pixels[3 * i + 2] = 7;
  }
  const Image rgb_out = resize(4, 4)(rgb, rng);
  for (size_t i = 0; i < 16; ++i) {
    CHECK(int{rgb_out.pixels[3 * i]} == int{out.pixels[i]});
    CHECK(int{rgb_out.pixels[3 * i + 1]} == 255 - int{out.pixels[i]});
    CHECK(int{rgb_out.pixels[3 * i + 2]} == 7);
  }
}

TEST_CASE("resize shrinks 4x4 to 2x2 by averaging neighbours", "[images]") {
  SampleRng rng(0, 0, 0);
  // Pixel (y, x) = 10 x + 40 y; output i samples input 2 i + 0.5.
  Image image(4, 4, 1);
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 4; ++x) image.at(y, x)[0] = static_cast<uint8_t>(10 * x + 40 * y);
  CHECK(pixels_of(resize(2, 2)(image, rng)) == std::vector<int>{25, 45, 105, 125});
  // Same size is a copy; one row stretches.
  CHECK(pixels_of(resize(4, 4)(image, rng)) == pixels_of(image));
  CHECK(pixels_of(resize(1, 4)(grey(1, 2, {0, 100}), rng)) == std::vector<int>{0, 25, 75, 100});
}

TEST_CASE("resize of the shorter side keeps the aspect ratio", "[images]") {
  SampleRng rng(0, 0, 0);
  const auto size_of = [&](int64_t height, int64_t width, int64_t size) {
    const Image out = resize(size)(varied_rgb(height, width), rng);
    return std::vector<int64_t>{out.height, out.width, out.channels};
  };
  CHECK(size_of(6, 9, 4) == std::vector<int64_t>{4, 6, 3});
  CHECK(size_of(9, 6, 4) == std::vector<int64_t>{6, 4, 3});
  CHECK(size_of(5, 7, 3) == std::vector<int64_t>{3, 4, 3});  // int(3 * 7 / 5) = 4
  CHECK(size_of(8, 8, 3) == std::vector<int64_t>{3, 3, 3});
  CHECK_THAT(error_of([] { resize(0); }), Catch::Contains("resize"));
  CHECK_THAT(error_of([] { resize(3, -1); }), Catch::Contains("3x-1"));
  CHECK_THAT(error_of([&] { resize(4)(Image(), rng); }), Catch::Contains("bad image 0x0x0"));
}

TEST_CASE("center_crop picks the middle and pads small images with black", "[images]") {
  SampleRng rng(0, 0, 0);
  const Image image = coordinates(5, 6);
  // Offsets round((5 - 2) / 2) = 2 (half to even) and (6 - 2) / 2 = 2.
  CHECK(pixels_of(center_crop(2)(image, rng)) == std::vector<int>{22, 23, 32, 33});
  // Offsets round(0.5) = 0 and 1.
  CHECK(pixels_of(center_crop(4)(image, rng)) == std::vector<int>{1, 2, 3, 4, 11, 12, 13, 14,  //
                                                                  21, 22, 23, 24, 31, 32, 33, 34});
  // A 2x3 image in a 4x4 square: (4 - 2) / 2 = 1 black row above, (4 - 3) / 2 = 0 columns left.
  const Image padded = center_crop(4)(coordinates(2, 3), rng);
  CHECK(pixels_of(padded) == std::vector<int>{0, 0, 0, 0,  //
                                              0, 1, 2, 0,   //
                                              10, 11, 12, 0, //
                                              0, 0, 0, 0});
  // Larger in one direction, smaller in the other.
  CHECK(pixels_of(center_crop(2)(coordinates(1, 4), rng)) == std::vector<int>{1, 2, 0, 0});
  const Image rgb = center_crop(3)(varied_rgb(3, 3), rng);
  CHECK(rgb.pixels == varied_rgb(3, 3).pixels);
}

TEST_CASE("random_horizontal_flip mirrors rows with probability p", "[images]") {
  SampleRng rng(0, 0, 0);
  Image rgb(1, 3, 3);
  rgb.pixels = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  CHECK(random_horizontal_flip(1.0)(rgb, rng).pixels == std::vector<uint8_t>{7, 8, 9, 4, 5, 6, 1, 2, 3});
  CHECK(random_horizontal_flip(0.0)(rgb, rng).pixels == rgb.pixels);
  CHECK(pixels_of(random_horizontal_flip(1.0)(coordinates(2, 3), rng)) == std::vector<int>{2, 1, 0, 12, 11, 10});
  // p = 0.5: about half of 200 seeds flip (a binomial's 6 sigma is 42).
  int flipped = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SampleRng sample_rng(seed, 0, 0);
    flipped += random_horizontal_flip()(rgb, sample_rng).pixels != rgb.pixels;
  }
  CHECK(flipped > 58);
  CHECK(flipped < 142);
  CHECK_THAT(error_of([] { random_horizontal_flip(1.5); }), Catch::Contains("1.5"));
}

TEST_CASE("random_resized_crop gives the size asked and is a function of the seed", "[images]") {
  const Image image = varied_rgb(20, 30);
  const ImageTransform crop = random_resized_crop(8);
  std::set<std::string> outputs;  // the distinct crops' bytes
  for (uint64_t index = 0; index < 12; ++index) {
    SampleRng first(3, 1, index), second(3, 1, index);
    const Image out = crop(image, first);
    CHECK(out.height == 8);
    CHECK(out.width == 8);
    CHECK(out.channels == 3);
    CHECK(crop(image, second).pixels == out.pixels);
    outputs.emplace(out.pixels.begin(), out.pixels.end());
  }
  CHECK(outputs.size() >= 10);
}

TEST_CASE("random_resized_crop of the whole image equals resize and falls back to a centre crop", "[images]") {
  SampleRng rng(5, 0, 0);
  const Image image = varied_rgb(20, 30);
  // Scale 1 at the image's own aspect ratio: w = sqrt(600 * 1.5) = 30, h = sqrt(600 / 1.5) = 20.
  CHECK(random_resized_crop(8, {1.0, 1.0}, {1.5, 1.5})(image, rng).pixels == resize(8, 8)(image, rng).pixels);
  // Ratio 3 never fits a 10x10 image at scale 1 (w = 17): the fallback takes the full width
  // and round(10 / 3) = 3 rows starting at (10 - 3) / 2 = 3.
  const Image square = varied_rgb(10, 10);
  Image band(3, 10, 3);
  std::copy(square.at(3, 0), square.at(6, 0), band.pixels.begin());
  CHECK(random_resized_crop(4, {1.0, 1.0}, {3.0, 3.0})(square, rng).pixels == resize(4, 4)(band, rng).pixels);
  CHECK_THAT(error_of([] { random_resized_crop(0); }), Catch::Contains("size 0"));
  CHECK_THAT(error_of([] { random_resized_crop(4, {0.5, 0.2}); }), Catch::Contains("scale"));
  CHECK_THAT(error_of([] { random_resized_crop(4, {0.1, 1.0}, {2.0, 1.0}); }), Catch::Contains("ratio"));
}

TEST_CASE("Transforms run the steps then normalize per channel", "[images]") {
  SampleRng rng(0, 0, 0);
  Image image(1, 2, 3);
  image.pixels = {0, 51, 255, 102, 153, 204};
  const Transforms per_channel{.steps = {}, .mean = {0.5f, 0.5f, 0.5f}, .std = {0.25f, 0.5f, 1.0f}};
  // (pixel / 255 - 0.5) / std, channels first.
  KILN_CHECK_CLOSE(per_channel(image, rng),
                   testing::f32s({-2.0f, (0.4f - 0.5f) / 0.25f, (0.2f - 0.5f) / 0.5f, (0.6f - 0.5f) / 0.5f,
                                  0.5f, (0.8f - 0.5f)},
                                 {3, 1, 2}),
                   0, 1e-6);
  const Transforms shared{.steps = {}, .mean = {0.2f}, .std = {0.5f}};
  KILN_CHECK_CLOSE(shared(grey(1, 2, {51, 255}), rng), testing::f32s({0.0f, 1.6f}, {1, 1, 2}), 0, 1e-6);
  const Transforms plain{.steps = {resize(4), center_crop(3), random_horizontal_flip()}};
  const Tensor t = plain(varied_rgb(6, 9), rng);
  CHECK(t.shape() == Shape{3, 3, 3});
  CHECK(t.dtype() == DType::f32);
}

TEST_CASE("Transforms reject means and stds that do not fit the channels", "[images]") {
  SampleRng rng(0, 0, 0);
  const Transforms imagenet{.steps = {}, .mean = kImageNetMean, .std = kImageNetStd};
  CHECK_THAT(error_of([&] { imagenet(grey(1, 1, {7}), rng); }), Catch::Contains("for an image of 1 channels"));
  const Transforms mean_only{.steps = {}, .mean = {0.5f}, .std = {}};
  CHECK_THAT(error_of([&] { mean_only(grey(1, 1, {7}), rng); }), Catch::Contains("Normalize"));
  const Transforms zero_std{.steps = {}, .mean = {0.5f}, .std = {0.0f}};
  CHECK_THAT(error_of([&] { zero_std(grey(1, 1, {7}), rng); }), Catch::Contains("positive"));
}

TEST_CASE("transforms refuse to make images above the pixel limit", "[images]") {
  // A 65500x1 strip resized to a shorter side of 512 is 512 x 33.5 M pixels: it used to end
  // in an uncaught std::bad_alloc in the data pipeline.
  SampleRng rng(0, 0, 0);
  const Image strip(65500, 1, 3);
  const std::string message = error_of([&] { resize(512)(strip, rng); });
  CHECK_THAT(message, Catch::StartsWith("resize: ") && Catch::Contains("33536000x512") &&
                          Catch::Contains(fmt::format("limit of {} pixels", kDefaultMaxImagePixels)));
  // So large that the size itself overflows.
  CHECK_THAT(error_of([&] { resize(int64_t{1} << 60)(strip, rng); }),
             Catch::StartsWith("resize: ") && Catch::Contains("too many pixels"));
  CHECK_THAT(error_of([&] { resize(100000, 100000)(strip, rng); }),
             Catch::StartsWith("resize: ") && Catch::Contains("100000x100000"));
  CHECK_THAT(error_of([&] { center_crop(100000)(strip, rng); }),
             Catch::StartsWith("center_crop: ") && Catch::Contains("100000x100000"));
  CHECK_THAT(error_of([&] { random_resized_crop(100000)(strip, rng); }),
             Catch::StartsWith("random_resized_crop: ") && Catch::Contains("100000x100000"));
  // Within the limit, the strip resizes.
  const Image resized = resize(2)(strip, rng);
  CHECK(resized.height == 131000);
  CHECK(resized.width == 2);
}
