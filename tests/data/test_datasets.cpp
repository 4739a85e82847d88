// SyntheticDataset and FashionMnist: determinism and shapes; the IDX reader on small files
// written here (plain and gzipped, corrupt ones too) and on the installed data set.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/fifo_testing.h"
#include "data/datasets.h"
#include "testing.h"

using namespace kiln;
using data::FashionMnist;
using data::SampleRng;
using data::Split;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temporary directory, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("kiln-test-datasets-{}", std::random_device{}());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  auto put = [&](uint32_t v) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A gzip file holding `bytes` in stored (uncompressed) deflate blocks: written by hand so
// that the test binary needs no zlib of its own (RFC 1951 section 3.2.4, RFC 1952).
std::vector<uint8_t> gzip_stored(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  auto put_le = [&](uint32_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  size_t pos = 0;
  do {
    const auto len = static_cast<uint32_t>(std::min<size_t>(bytes.size() - pos, 65535));
    out.push_back(pos + len == bytes.size() ? 1 : 0);  // BFINAL on the last block, BTYPE 00
    put_le(len, 2);
    put_le(~len & 0xffffu, 2);
    out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(pos),
               bytes.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  } while (pos < bytes.size());
  uint32_t crc = 0xffffffffu;  // CRC-32, bit by bit: the files are tiny
  for (uint8_t b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  put_le(~crc, 4);
  put_le(static_cast<uint32_t>(bytes.size()), 4);
  return out;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes, bool gzip) {
  const std::vector<uint8_t> contents = gzip ? gzip_stored(bytes) : bytes;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(contents.data()),
             static_cast<std::streamsize>(contents.size()));
}

// Three 4x5 images, pixel k of image n = (n * 20 + k) * 4, labels 9, 0, 4.
constexpr uint32_t kCount = 3, kRows = 4, kCols = 5;
std::vector<uint8_t> small_pixels() {
  std::vector<uint8_t> p(kCount * kRows * kCols);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 4);
  return p;
}
const std::vector<uint8_t> kSmallLabels = {9, 0, 4};

void write_small_set(const fs::path& root, const std::string& prefix, bool gzip_images,
                     bool gzip_labels) {
  write_file(root / (prefix + "-images-idx3-ubyte" + (gzip_images ? ".gz" : "")),
             idx_bytes(2051, {kCount, kRows, kCols}, small_pixels()), gzip_images);
  write_file(root / (prefix + "-labels-idx1-ubyte" + (gzip_labels ? ".gz" : "")),
             idx_bytes(2049, {kCount}, kSmallLabels), gzip_labels);
}

float normalized(int pixel) { return (static_cast<float>(pixel) / 255.0f - 0.2860f) / 0.3530f; }

}  // namespace

TEST_CASE("SyntheticDataset is a deterministic function of seed and index", "[loader]") {
  // 9x9 planes: 81 pixels, not a multiple of the 8 noise values per Philox block.
  const data::SyntheticOptions options{
      .size = 20, .num_classes = 4, .channels = 3, .image_size = 9, .seed = 3};
  const data::SyntheticDataset dataset(options);
  REQUIRE(dataset.size() == 20);
  REQUIRE(dataset.num_classes() == 4);
  REQUIRE(dataset.sample_shape() == Shape{3, 9, 9});
  REQUIRE(dataset.describe() == "synthetic (seed 3): 20 samples, 4 classes, [3, 9, 9]");

  SampleRng rng_a(0, 0, 0), rng_b(5, 6, 7);
  const data::Sample a = dataset.get(7, rng_a), b = dataset.get(7, rng_b);
  REQUIRE(a.input.shape() == Shape{3, 9, 9});
  REQUIRE(a.label == b.label);
  KILN_CHECK_EQUAL(a.input, b.input);  // the rng is not used
  data::SyntheticOptions other_seed = options;
  other_seed.seed = 4;
  REQUIRE_FALSE(
      testing::allclose(data::SyntheticDataset(other_seed).get(7, rng_a).input, a.input, 0, 0));

  // Labels cover the classes; a sample's channel means sit near its class's mean (noise is
  // uniform in [-1, 1): the mean of 81 values has std 0.064, so 0.3 is over 4 sigma), and
  // samples of different classes differ in at least one channel.
  std::vector<std::vector<double>> channel_means(20);
  std::vector<int64_t> labels(20);
  std::vector<int> per_class(4);
  for (int64_t i = 0; i < 20; ++i) {
    const data::Sample s = dataset.get(i, rng_a);
    labels[static_cast<size_t>(i)] = s.label;
    REQUIRE((s.label >= 0 && s.label < 4));
    ++per_class[static_cast<size_t>(s.label)];
    for (int64_t c = 0; c < 3; ++c) {
      const std::vector<double> v = testing::values(s.input[c]);
      for (double x : v) REQUIRE((x >= -2.0 && x < 2.0));
      channel_means[static_cast<size_t>(i)].push_back(testing::mean_of(v));
    }
  }
  for (int count : per_class) REQUIRE(count > 0);
  for (size_t i = 0; i < 20; ++i)
    for (size_t j = 0; j < i; ++j)
      if (labels[i] == labels[j])
        for (size_t c = 0; c < 3; ++c)
          REQUIRE(channel_means[i][c] == Approx(channel_means[j][c]).margin(0.3));

  // ImageNet-sized samples work too (and quickly).
  const data::SyntheticDataset imagenet({.size = 2});
  REQUIRE(imagenet.get(1, rng_a).input.shape() == Shape{3, 224, 224});

  REQUIRE_THROWS_WITH(dataset.get(20, rng_a), Catch::Contains("index 20 outside [0, 20)"));
  REQUIRE_THROWS_AS(dataset.get(-1, rng_a), Error);
  REQUIRE_THROWS_AS(data::SyntheticDataset({.num_classes = 0}), Error);
  REQUIRE_THROWS_AS(data::SyntheticDataset({.image_size = 0}), Error);
}

TEST_CASE("FashionMnist reads small IDX files plain and gzipped", "[loader]") {
  TempDir dir;
  write_small_set(dir.path, "train", false, false);
  write_small_set(dir.path, "t10k", true, true);
  const std::vector<uint8_t> pixels = small_pixels();
  for (Split split : {Split::train, Split::test}) {
    INFO((split == Split::train ? "train (plain)" : "test (gzipped)"));
    const FashionMnist set(dir.path, split);
    REQUIRE(set.size() == 3);
    REQUIRE(set.num_classes() == 10);
    REQUIRE(set.sample_shape() == Shape{1, 4, 5});
    REQUIRE(set.describe() == fmt::format("fashion-mnist {}: 3 samples, 10 classes, [1, 4, 5]",
                                          split == Split::train ? "train" : "test"));
    SampleRng rng(0, 0, 0);
    for (int64_t n = 0; n < 3; ++n) {
      const data::Sample s = set.get(n, rng);
      REQUIRE(s.label == kSmallLabels[static_cast<size_t>(n)]);
      REQUIRE(s.input.shape() == Shape{1, 4, 5});
      std::vector<float> expected;
      for (int k = 0; k < 20; ++k)
        expected.push_back(normalized(pixels[static_cast<size_t>(n * 20 + k)]));
      KILN_CHECK_CLOSE(s.input, testing::f32s(expected, {1, 4, 5}), 0,
                       1e-6);  // the same float formula
    }
    REQUIRE_THROWS_WITH(set.get(3, rng), Catch::Contains("index 3 outside [0, 3)"));
  }
  // Mixed: compressed images with plain labels.
  fs::remove(dir.path / "train-labels-idx1-ubyte");
  write_small_set(dir.path, "train", true, false);
  REQUIRE(FashionMnist(dir.path, Split::train).size() == 3);
  REQUIRE(FashionMnist::class_names().size() == 10);
  REQUIRE(FashionMnist::class_names()[9] == "Ankle boot");
}

TEST_CASE("FashionMnist runs transforms on a grey Image", "[loader]") {
  TempDir dir;
  write_small_set(dir.path, "train", true, true);
  // A random 2x3 crop: its corner drawn from the sample's rng.
  const data::ImageTransform random_crop = [](const data::Image& image, SampleRng& rng) {
    const auto y = static_cast<int64_t>(rng.below(static_cast<uint64_t>(image.height - 1)));
    const auto x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(image.width - 2)));
    data::Image out(2, 3, image.channels);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < 3; ++c) *out.at(r, c) = *image.at(y + r, x + c);
    return out;
  };
  const FashionMnist set(dir.path, Split::train,
                         data::Transforms{.steps = {random_crop}, .mean = {0.5f}, .std = {0.25f}});
  REQUIRE(set.sample_shape() == Shape{1, 2, 3});
  SampleRng rng(1, 2, 1), replay(1, 2, 1);
  const data::Sample s = set.get(1, rng);
  REQUIRE(s.label == 0);
  const auto y = static_cast<int64_t>(replay.below(3)), x = static_cast<int64_t>(replay.below(3));
  const std::vector<uint8_t> pixels = small_pixels();
  std::vector<float> expected;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 3; ++c)
      expected.push_back((pixels[static_cast<size_t>(20 + (y + r) * 5 + x + c)] / 255.0f - 0.5f) /
                         0.25f);
  KILN_CHECK_CLOSE(s.input, testing::f32s(expected, {1, 2, 3}), 0, 1e-6);
}

TEST_CASE("FashionMnist names the file for missing and corrupt data", "[loader]") {
  TempDir dir;
  const fs::path missing = dir.path / "nowhere";
  REQUIRE_THROWS_WITH(
      FashionMnist(missing, Split::train),
      Catch::Contains((missing / "train-images-idx3-ubyte").string() + "(.gz) not found") &&
          Catch::Contains("apt-get install dataset-fashion-mnist"));

  const std::vector<uint8_t> pixels = small_pixels();
  const fs::path images = dir.path / "train-images-idx3-ubyte",
                 labels = dir.path / "train-labels-idx1-ubyte";
  write_file(labels, idx_bytes(2049, {kCount}, kSmallLabels), false);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains("train-images-idx3-ubyte(.gz) not found"));

  // Wrong magic: a labels file where the images should be.
  write_file(images, idx_bytes(2049, {kCount, kRows, kCols}, pixels), false);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains(images.string() + " has magic number 2049, expected 2051"));

  // Truncated pixels, plain and gzipped.
  std::vector<uint8_t> short_pixels(pixels.begin(), pixels.end() - 7);
  write_file(images, idx_bytes(2051, {kCount, kRows, kCols}, short_pixels), false);
  REQUIRE_THROWS_WITH(
      FashionMnist(dir.path, Split::train),
      Catch::Contains(images.string() +
                      " is truncated: it ends 53 bytes into the pixels (60 bytes)"));
  fs::remove(images);
  fs::path gz_images = images;
  gz_images += ".gz";
  write_file(gz_images, idx_bytes(2051, {kCount, kRows, kCols}, short_pixels), true);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains(gz_images.string() + " is truncated"));
  // A gzip stream cut short.
  write_file(gz_images, idx_bytes(2051, {kCount, kRows, kCols}, pixels), true);
  {
    std::ifstream in(gz_images, std::ios::binary);
    std::vector<uint8_t> compressed((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
    compressed.resize(compressed.size() - 12);  // drops the trailer and some data
    write_file(gz_images, compressed, false);
  }
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train), Catch::Contains(gz_images.string()));

  // Counts that disagree, and a label that is no class.
  write_file(gz_images, idx_bytes(2051, {kCount, kRows, kCols}, pixels), true);
  REQUIRE(FashionMnist(dir.path, Split::train).size() == 3);
  write_file(labels, idx_bytes(2049, {2}, {1, 2}), false);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains(labels.string() + " holds 2 labels but") &&
                          Catch::Contains("holds 3 images"));
  write_file(labels, idx_bytes(2049, {kCount}, {1, 10, 2}), false);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains("label 10 of sample 1 is not a class"));
}

TEST_CASE("FashionMnist refuses FIFOs and huge counts without blocking or allocating", "[loader]") {
  TempDir dir;
  const fs::path images = dir.path / "train-images-idx3-ubyte",
                 labels = dir.path / "train-labels-idx1-ubyte";
  {
    // gzopen() of a FIFO with no writer used to block forever.
    testing::Fifo fifo(images);
    write_file(labels, idx_bytes(2049, {kCount}, kSmallLabels), false);
    REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                        Catch::Contains(images.string() + " is not a regular file (a FIFO)"));
  }
  fs::remove(labels);
  {
    testing::Fifo fifo(labels);
    write_file(images, idx_bytes(2051, {kCount, kRows, kCols}, small_pixels()), false);
    REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                        Catch::Contains(labels.string() + " is not a regular file (a FIFO)"));
  }
  // A plain file whose header claims 2^32 - 1 images of 65536x65536 pixels is refused from
  // its size, before anything is allocated for the pixels.
  write_file(images, idx_bytes(2051, {0xFFFFFFFFu, 65536, 65536}, small_pixels()), false);
  write_file(labels, idx_bytes(2049, {kCount}, kSmallLabels), false);
  REQUIRE_THROWS_WITH(FashionMnist(dir.path, Split::train),
                      Catch::Contains(images.string() + " is truncated: it ends 60 bytes into the pixels "
                                      "(18446744069414584320 bytes)"));
}

TEST_CASE("FashionMnist reads the installed data set", "[loader]") {
  if (!fs::exists(data::kFashionMnistDir)) {
    WARN("skipped: " << data::kFashionMnistDir
                     << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  const FashionMnist train(data::kFashionMnistDir, Split::train);
  const FashionMnist test(data::kFashionMnistDir, Split::test);
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);
  REQUIRE(train.sample_shape() == Shape{1, 28, 28});
  SampleRng rng(0, 0, 0);
  REQUIRE(train.get(0, rng).label == 9);  // the famous first ankle boot
  std::vector<int64_t> per_class(10);
  double sum = 0, sum_squares = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    const data::Sample s = train.get(i, rng);
    REQUIRE((s.label >= 0 && s.label < 10));
    ++per_class[static_cast<size_t>(s.label)];
    const float* p = s.input.data_ptr<float>();
    for (int64_t k = 0; k < 784; ++k) {
      sum += p[k];
      sum_squares += static_cast<double>(p[k]) * p[k];
    }
  }
  for (int64_t count : per_class) REQUIRE(count == 6000);
  // Normalized with the training set's own statistics (given to 4 digits): mean 0, std 1.
  const double n = 60000.0 * 784, mean = sum / n;
  REQUIRE(mean == Approx(0).margin(1e-3));
  REQUIRE(std::sqrt(sum_squares / n - mean * mean) == Approx(1).margin(1e-3));
  for (int64_t i = 0; i < test.size(); i += 997) REQUIRE(test.get(i, rng).label < 10);
}
