#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <array>
#include <climits>
#include <cstring>
#include <memory>

#include "core/ops/factory.h"
#include "core/regular_file.h"
#include "data/datasets.h"

namespace kiln::data {

namespace {

namespace fs = std::filesystem;

// The training set's pixel mean and standard deviation (of pixel / 255).
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;
constexpr uint32_t kImagesMagic = 2051;  // IDX: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // IDX: unsigned bytes, 1 dimension

// An IDX file opened through zlib, which reads gzip-compressed and plain files alike. The
// file is opened as a regular file first (core/regular_file.h), so a FIFO or a device at the
// path is refused instead of blocking, and handed to zlib as a descriptor.
class IdxFile {
 public:
  explicit IdxFile(const fs::path& path) : path_(path), file_(nullptr, &gzclose) {
    RegularFile regular(path, "fashion-mnist");
    size_ = regular.size();
    file_.reset(gzdopen(regular.fd(), "rb"));
    if (!file_) fail("fashion-mnist: cannot open {}: out of memory for zlib", path_.string());
    regular.release();  // gzclose closes it now
  }

  // Reads exactly `bytes` bytes into `out`; a short file is an error naming it. `offset` and
  // `total` place this read within a larger one, for the message.
  void read(void* out, uint64_t bytes, const char* what, uint64_t offset = 0, uint64_t total = 0) {
    auto* p = static_cast<char*>(out);
    uint64_t done = 0;
    while (done < bytes) {
      const auto chunk = static_cast<unsigned>(std::min<uint64_t>(bytes - done, INT_MAX / 2));
      const int got = gzread(file_.get(), p + done, chunk);
      if (got < 0) {
        int code = 0;
        fail("fashion-mnist: {}: reading {} failed: {}", path_.string(), what,
             gzerror(file_.get(), &code));
      }
      if (got == 0) truncated(offset + done, what, total == 0 ? bytes : total);
      done += static_cast<uint64_t>(got);
    }
  }

  // Reads `bytes` bytes into `out`. A plain file too short for them is refused before
  // anything is allocated; a compressed one is read in chunks, so that a corrupt header
  // claiming a huge count fails as a truncated file rather than as a huge allocation.
  void read_all(std::vector<uint8_t>& out, uint64_t bytes, const char* what) {
    const auto position = static_cast<int64_t>(gztell(file_.get()));
    if (gzdirect(file_.get()) && position >= 0) {
      const auto left = static_cast<uint64_t>(std::max<int64_t>(0, size_ - position));
      if (bytes > left) truncated(left, what, bytes);
    }
    constexpr uint64_t kChunk = uint64_t{1} << 24;
    out.clear();
    while (out.size() < bytes) {
      const uint64_t done = out.size(), n = std::min(bytes - done, kChunk);
      out.resize(static_cast<size_t>(done + n));
      read(out.data() + done, n, what, done, bytes);
    }
  }

  uint32_t read_u32(const char* what) {
    std::array<unsigned char, 4> b{};
    read(b.data(), 4, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  const fs::path& path() const { return path_; }

 private:
  [[noreturn]] void truncated(uint64_t at, const char* what, uint64_t total) const {
    fail("fashion-mnist: {} is truncated: it ends {} bytes into {} ({} bytes)", path_.string(), at,
         what, total);
  }

  fs::path path_;
  int64_t size_ = 0;  // of the file on disk (compressed or not)
  std::unique_ptr<gzFile_s, decltype(&gzclose)> file_;
};

// root/name, or root/name.gz when only the compressed file is there. Anything at the path
// counts as there: IdxFile then refuses what is not a regular file, naming it.
fs::path find_idx(const fs::path& root, const std::string& name) {
  std::error_code ec;
  const fs::path plain = root / name;
  if (fs::exists(plain, ec)) return plain;
  fs::path gz = plain;
  gz += ".gz";
  if (fs::exists(gz, ec)) return gz;
  fail(
      "fashion-mnist: {}(.gz) not found; install Debian's dataset-fashion-mnist package "
      "(apt-get install dataset-fashion-mnist)",
      plain.string());
}

void check_magic(IdxFile& file, uint32_t expected) {
  const uint32_t magic = file.read_u32("the magic number");
  KILN_CHECK(magic == expected,
             "fashion-mnist: {} has magic number {}, expected {} for an IDX {} file",
             file.path().string(), magic, expected, expected == kImagesMagic ? "images" : "labels");
}

// pixel -> (pixel / 255 - mean) / std, for all 256 pixel values.
const std::array<float, 256>& normalize_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int p = 0; p < 256; ++p)
      t[static_cast<size_t>(p)] = (static_cast<float>(p) / 255.0f - kMean) / kStd;
    return t;
  }();
  return table;
}

}  // namespace

FashionMnist::FashionMnist(const std::filesystem::path& root, Split split,
                           std::optional<Transforms> transforms)
    : split_(split), transforms_(std::move(transforms)) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  // Both files are found before either is read, so a missing one is reported at once.
  const fs::path images_path = find_idx(root, prefix + "-images-idx3-ubyte");
  const fs::path labels_path = find_idx(root, prefix + "-labels-idx1-ubyte");

  IdxFile images(images_path);
  check_magic(images, kImagesMagic);
  const uint32_t count = images.read_u32("the image count");
  const uint32_t rows = images.read_u32("the row count");
  const uint32_t cols = images.read_u32("the column count");
  KILN_CHECK(rows >= 1 && cols >= 1 && rows <= 65536 && cols <= 65536,
             "fashion-mnist: {} has images of {}x{} pixels", images_path.string(), rows, cols);
  rows_ = rows;
  cols_ = cols;
  // Below 2^64: both factors are under 2^32.
  const uint64_t image_bytes = uint64_t{rows} * cols;
  images.read_all(images_, count * image_bytes, "the pixels");

  IdxFile labels(labels_path);
  check_magic(labels, kLabelsMagic);
  const uint32_t label_count = labels.read_u32("the label count");
  KILN_CHECK(label_count == count, "fashion-mnist: {} holds {} labels but {} holds {} images",
             labels_path.string(), label_count, images_path.string(), count);
  labels.read_all(labels_, label_count, "the labels");
  for (size_t i = 0; i < labels_.size(); ++i)
    KILN_CHECK(labels_[i] < num_classes(),
               "fashion-mnist: {}: label {} of sample {} is not a class (0 to 9)",
               labels_path.string(), labels_[i], i);

  shape_ = {1, rows_, cols_};
  if (transforms_ && count > 0) {
    // Transforms decide the shape; run them once on the first image to learn it.
    SampleRng rng(0, 0, 0);
    shape_ = get(0, rng).input.shape();
  }
}

int64_t FashionMnist::size() const { return static_cast<int64_t>(labels_.size()); }

std::vector<int64_t> FashionMnist::sample_shape() const { return shape_; }

Sample FashionMnist::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < size(), "FashionMnist::get: index {} outside [0, {})", index,
             size());
  const int64_t pixels = rows_ * cols_;
  const uint8_t* in = images_.data() + index * pixels;
  const int64_t label = labels_[static_cast<size_t>(index)];
  if (transforms_) {
    Image image(rows_, cols_, 1);
    std::memcpy(image.pixels.data(), in, static_cast<size_t>(pixels));
    return Sample{(*transforms_)(image, rng), label};
  }
  Tensor input = empty({1, rows_, cols_});
  float* out = input.data_ptr<float>();
  const std::array<float, 256>& table = normalize_table();
  for (int64_t i = 0; i < pixels; ++i) out[i] = table[in[i]];
  return Sample{std::move(input), label};
}

std::string FashionMnist::describe() const {
  return fmt::format("fashion-mnist {}: {} samples, {} classes, [{}]",
                     split_ == Split::train ? "train" : "test", size(), num_classes(),
                     fmt::join(shape_, ", "));
}

std::vector<std::string> FashionMnist::class_names() {
  return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
}

}  // namespace kiln::data
