// ImageFolder over a small folder of JPEGs (sorted classes, labels, extensions, ignored
// files, grey to RGB, corrupt files as BadSample, shape and root errors) and the generated
// shapes set (files, determinism, the stamp making a second call a no-op, regeneration on
// new options, refusal to overwrite a foreign folder, every image decoding).
//
// Tolerances: a flat colour through JPEG at quality 95 and a resize stays within 3/255 of
// its value.
#include "testing.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "data/loader.h"

using namespace kiln;
using namespace kiln::data;
namespace fs = std::filesystem;

namespace {

struct TempFolder {
  fs::path path;
  TempFolder() {
    std::random_device device;
    path = fs::temp_directory_path() / ("kiln-test-folder-" + std::to_string(device()));
    fs::create_directories(path);
  }
  ~TempFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception of the expected type thrown)";
}

Image flat(int64_t size, int64_t channels, uint8_t value) {
  Image image(size, size, channels);
  std::fill(image.pixels.begin(), image.pixels.end(), value);
  return image;
}

void write_jpeg_at(const fs::path& path, const Image& image) {
  fs::create_directories(path.parent_path());
  write_jpeg(path, image, 95);
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// root/cat/{2.jpg, 1.JPEG}, root/ant/z.jpeg, root/bee/sub/a.jpg (grey), plus files and
// folders ImageFolder must skip.
void write_animals(const fs::path& root) {
  write_jpeg_at(root / "cat" / "2.jpg", flat(16, 3, 200));
  write_jpeg_at(root / "cat" / "1.JPEG", flat(16, 3, 180));
  write_jpeg_at(root / "ant" / "z.jpeg", flat(16, 3, 20));
  write_jpeg_at(root / "bee" / "sub" / "a.jpg", flat(16, 1, 100));
  std::ofstream(root / "cat" / "notes.txt") << "not an image";
  std::ofstream(root / "readme.jpg") << "a file at the top is not a class";
  write_jpeg_at(root / ".hidden" / "x.jpg", flat(16, 3, 0));
  std::ofstream(root / "ant" / "._z.jpeg") << "macOS resource fork";
}

}  // namespace

TEST_CASE("ImageFolder sorts classes and files and labels each image by its folder", "[images]") {
  TempFolder folder;
  write_animals(folder.path);
  const ImageFolder images(folder.path, Transforms{.steps = {resize(8, 8)}}, {3, 8, 8});
  CHECK(images.classes() == std::vector<std::string>{"ant", "bee", "cat"});
  REQUIRE(images.size() == 4);
  CHECK(images.num_classes() == 3);
  CHECK(images.file(0) == folder.path / "ant" / "z.jpeg");
  CHECK(images.file(1) == folder.path / "bee" / "sub" / "a.jpg");
  CHECK(images.file(2) == folder.path / "cat" / "1.JPEG");
  CHECK(images.file(3) == folder.path / "cat" / "2.jpg");
  CHECK(images.sample_shape() == Shape{3, 8, 8});
  CHECK_THAT(images.describe(), Catch::Contains("4 samples, 3 classes, [3,8,8]"));
  const std::vector<int64_t> labels = {0, 1, 2, 2};
  const std::vector<double> values = {20, 100, 180, 200};
  for (int64_t i = 0; i < 4; ++i) {
    SampleRng rng(0, 0, static_cast<uint64_t>(i));
    const Sample sample = images.get(i, rng);
    CHECK(sample.label == labels[static_cast<size_t>(i)]);
    REQUIRE(sample.input.shape() == Shape{3, 8, 8});
    // The grey image comes back as three equal channels.
    for (double v : testing::values(sample.input)) CHECK(v == Approx(values[static_cast<size_t>(i)] / 255).margin(3.0 / 255));
  }
  SampleRng rng(0, 0, 0);
  CHECK_THAT(error_of([&] { images.get(4, rng); }), Catch::Contains("index 4 outside [0, 4)"));
  CHECK_THAT(error_of([&] { images.file(-1); }), Catch::Contains("index -1"));
}

TEST_CASE("ImageFolder turns RGB images grey for a 1-channel sample_shape", "[images]") {
  TempFolder folder;
  write_jpeg_at(folder.path / "only" / "a.jpg", flat(8, 3, 90));
  const ImageFolder images(folder.path, Transforms{}, {1, 8, 8});
  SampleRng rng(0, 0, 0);
  const Sample sample = images.get(0, rng);
  REQUIRE(sample.input.shape() == Shape{1, 8, 8});
  CHECK(testing::values(sample.input)[0] == Approx(90.0 / 255).margin(3.0 / 255));
}

TEST_CASE("ImageFolder throws BadSample naming a corrupt or vanished file", "[images]") {
  TempFolder folder;
  write_animals(folder.path);
  const fs::path corrupt = folder.path / "cat" / "3.jpg";
  std::ofstream(corrupt) << "definitely not a JPEG";
  const ImageFolder images(folder.path, Transforms{.steps = {resize(8, 8)}}, {3, 8, 8});
  REQUIRE(images.size() == 5);
  REQUIRE(images.file(4) == corrupt);
  SampleRng rng(0, 0, 4);
  CHECK_THAT(error_of<BadSample>([&] { images.get(4, rng); }), Catch::Contains(corrupt.string()));
  // A truncated file too.
  const std::string whole = bytes_of(images.file(3));
  std::ofstream(images.file(3), std::ios::binary | std::ios::trunc) << whole.substr(0, whole.size() / 2);
  CHECK_THAT(error_of<BadSample>([&] { images.get(3, rng); }), Catch::Contains(images.file(3).string()));
  fs::remove(images.file(0));
  CHECK_THAT(error_of<BadSample>([&] { images.get(0, rng); }), Catch::Contains(images.file(0).string()));
  // The others still load.
  CHECK(images.get(2, rng).label == 2);
}

TEST_CASE("ImageFolder makes corrupt entropy data and oversized JPEGs BadSamples the loader skips", "[images]") {
  // libjpeg decodes past corrupt data with only a warning; kiln-train --skip-bad-images
  // (the loader's skip_bad_samples) must see such a file as bad, not train on garbage.
  TempFolder folder;
  write_animals(folder.path);
  const auto write_bytes = [](const fs::path& path, const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  std::vector<uint8_t> extra = encode_jpeg(flat(16, 3, 90));
  extra.insert(extra.end() - 2, {0x12, 0x34, 0x56});  // stray bytes before the end marker
  const fs::path corrupt = folder.path / "ant" / "corrupt.jpg";
  write_bytes(corrupt, extra);
  // A small file whose frame header claims 40000x40000 pixels.
  std::vector<uint8_t> huge = encode_jpeg(flat(16, 3, 90));
  for (size_t i = 2; i + 9 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0) {
      huge[i + 5] = huge[i + 7] = 40000 >> 8;
      huge[i + 6] = huge[i + 8] = 40000 & 0xFF;
      break;
    }
  const fs::path oversized = folder.path / "bee" / "oversized.jpg";
  write_bytes(oversized, huge);
  const auto images = std::make_shared<ImageFolder>(folder.path, Transforms{.steps = {resize(8, 8)}},
                                                    std::vector<int64_t>{3, 8, 8});
  REQUIRE(images->size() == 6);
  REQUIRE(images->file(0) == corrupt);
  REQUIRE(images->file(2) == oversized);
  SampleRng rng(0, 0, 0);
  CHECK_THAT(error_of<BadSample>([&] { images->get(0, rng); }),
             Catch::Contains(corrupt.string()) && Catch::Contains("Corrupt JPEG data"));
  CHECK_THAT(error_of<BadSample>([&] { images->get(2, rng); }),
             Catch::Contains(oversized.string()) && Catch::Contains("40000x40000") && Catch::Contains("limit"));
  Loader loader(images, {.batch_size = 8, .skip_bad_samples = true});
  int64_t samples = 0;
  for (Batch& batch : loader.epoch(0)) samples += batch.input.shape()[0];
  CHECK(samples == 4);
  CHECK(loader.skipped() == 2);
}

TEST_CASE("ImageFolder makes an image that a transform would blow up over the limit a BadSample", "[images]") {
  // A 1000x2 strip decodes within a limit of 100,000 pixels, but resize(64), the short side
  // to 64, would make it 32000x64: a property of that image, which the loader may skip.
  TempFolder folder;
  write_animals(folder.path);
  const fs::path strip = folder.path / "ant" / "strip.jpg";
  Image image(1000, 2, 3);
  write_jpeg(strip, image);
  const int64_t saved = max_image_pixels();
  set_max_image_pixels(100000);
  const auto images = std::make_shared<ImageFolder>(
      folder.path, Transforms{.steps = {resize(64), center_crop(64)}}, std::vector<int64_t>{3, 64, 64});
  REQUIRE(images->file(0) == strip);
  SampleRng rng(0, 0, 0);
  CHECK_THAT(error_of<BadSample>([&] { images->get(0, rng); }),
             Catch::Contains(strip.string()) && Catch::Contains("32000x64") && Catch::Contains("limit"));
  Loader loader(images, {.batch_size = 8, .skip_bad_samples = true});
  int64_t samples = 0;
  for (Batch& batch : loader.epoch(0)) samples += batch.input.shape()[0];
  set_max_image_pixels(saved);
  CHECK(samples == 4);
  CHECK(loader.skipped() == 1);
}

TEST_CASE("ImageFolder reports a shape the transforms do not produce", "[images]") {
  TempFolder folder;
  write_animals(folder.path);
  const ImageFolder images(folder.path, Transforms{}, {3, 8, 8});
  SampleRng rng(0, 0, 0);
  const std::string message = error_of([&] { images.get(0, rng); });
  CHECK_THAT(message, Catch::Contains("[3,16,16]"));
  CHECK_THAT(message, Catch::Contains("[3,8,8]"));
  CHECK_THAT(message, Catch::Contains("z.jpeg"));
  CHECK_THAT(error_of([&] { ImageFolder(folder.path, Transforms{}, {3, 0, 8}); }), Catch::Contains("sample_shape"));
}

TEST_CASE("ImageFolder rejects a missing or empty root", "[images]") {
  TempFolder folder;
  const fs::path missing = folder.path / "missing";
  CHECK_THAT(error_of([&] { ImageFolder(missing, Transforms{}, {3, 8, 8}); }), Catch::Contains(missing.string()));
  CHECK_THAT(error_of([&] { ImageFolder(folder.path, Transforms{}, {3, 8, 8}); }),
             Catch::Contains("no .jpg or .jpeg images"));
  fs::create_directories(folder.path / "empty_class");
  std::ofstream(folder.path / "empty_class" / "a.png") << "png";
  CHECK_THAT(error_of([&] { ImageFolder(folder.path, Transforms{}, {3, 8, 8}); }),
             Catch::Contains(folder.path.string()));
}

namespace {

const ShapesOptions kSmallShapes{.train_per_class = 3, .val_per_class = 1, .image_size = 32, .seed = 4};

// Every file under root, relative, with its bytes.
std::vector<std::pair<std::string, std::string>> contents_of(const fs::path& root) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    if (entry.is_regular_file()) files.emplace_back(fs::relative(entry.path(), root).string(), bytes_of(entry.path()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("generate_shapes writes every class of each split and each image decodes", "[images]") {
  TempFolder folder;
  const fs::path root = folder.path / "shapes";
  generate_shapes(root, kSmallShapes);
  const std::vector<std::string> classes = shapes_classes();
  REQUIRE(classes.size() == 10);
  CHECK(std::is_sorted(classes.begin(), classes.end()));
  for (const std::string& name : classes) {
    for (const char* file : {"00000.jpg", "00001.jpg", "00002.jpg"}) CHECK(fs::is_regular_file(root / "train" / name / file));
    CHECK_FALSE(fs::exists(root / "train" / name / "00003.jpg"));
    CHECK(fs::is_regular_file(root / "val" / name / "00000.jpg"));
    CHECK_FALSE(fs::exists(root / "val" / name / "00001.jpg"));
  }
  CHECK(contents_of(root).size() == 41);  // 40 images and the stamp
  // Nothing but the set is left next to it (no temporary folder).
  CHECK(std::distance(fs::directory_iterator(folder.path), fs::directory_iterator()) == 1);
  const ImageFolder train(root / "train", Transforms{}, {3, 32, 32});
  CHECK(train.classes() == classes);
  REQUIRE(train.size() == 30);
  for (int64_t i = 0; i < train.size(); ++i) {
    SampleRng rng(0, 0, static_cast<uint64_t>(i));
    CHECK(train.get(i, rng).label == i / 3);
  }
  const Image image = read_jpeg(root / "val" / "star" / "00000.jpg");
  CHECK(image.height == 32);
  CHECK(image.width == 32);
  CHECK(image.channels == 3);
}

TEST_CASE("generate_shapes is deterministic and a second call is a no-op", "[images]") {
  TempFolder folder;
  generate_shapes(folder.path / "a", kSmallShapes);
  generate_shapes(folder.path / "b", kSmallShapes);
  ShapesOptions other_seed = kSmallShapes;
  other_seed.seed = 5;
  generate_shapes(folder.path / "c", other_seed);
  const auto a = contents_of(folder.path / "a");
  CHECK(a == contents_of(folder.path / "b"));
  const auto c = contents_of(folder.path / "c");
  REQUIRE(c.size() == a.size());
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i].second != c[i].second;
  CHECK(differing >= 40);  // every image differs; the stamps do too
  // The stamp marks a complete set: a changed image stays changed.
  const fs::path image = folder.path / "a" / "train" / "ring" / "00001.jpg";
  std::ofstream(image, std::ios::trunc) << "junk";
  generate_shapes(folder.path / "a", kSmallShapes);
  CHECK(bytes_of(image) == "junk");
  // New options replace the set.
  ShapesOptions smaller = kSmallShapes;
  smaller.image_size = 24;
  generate_shapes(folder.path / "a", smaller);
  CHECK(read_jpeg(image).height == 24);
  CHECK(std::distance(fs::directory_iterator(folder.path), fs::directory_iterator()) == 3);
}

TEST_CASE("generate_shapes refuses to replace a folder it did not make and bad options", "[images]") {
  TempFolder folder;
  const fs::path mine = folder.path / "mine";
  fs::create_directories(mine);
  std::ofstream(mine / "thesis.txt") << "precious";
  CHECK_THAT(error_of([&] { generate_shapes(mine, kSmallShapes); }), Catch::Contains("not a shapes set"));
  CHECK(bytes_of(mine / "thesis.txt") == "precious");
  // An empty folder is fine to fill.
  fs::create_directories(folder.path / "empty");
  generate_shapes(folder.path / "empty/", kSmallShapes);
  CHECK(fs::exists(folder.path / "empty" / "val" / "circle" / "00000.jpg"));
  ShapesOptions bad = kSmallShapes;
  bad.image_size = 4;
  CHECK_THAT(error_of([&] { generate_shapes(folder.path / "x", bad); }), Catch::Contains("image_size 4"));
  bad = kSmallShapes;
  bad.quality = 0;
  CHECK_THAT(error_of([&] { generate_shapes(folder.path / "x", bad); }), Catch::Contains("quality 0"));
  bad = kSmallShapes;
  bad.train_per_class = -1;
  CHECK_THAT(error_of([&] { generate_shapes(folder.path / "x", bad); }), Catch::Contains("-1"));
  CHECK_FALSE(fs::exists(folder.path / "x"));
}
