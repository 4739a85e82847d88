#include <algorithm>
#include <cctype>
#include <system_error>

#include "core/error.h"
#include "data/datasets.h"

namespace kiln::data {

namespace {

bool is_jpeg_name(const std::filesystem::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg";
}

// Hidden entries are skipped: ".ipynb_checkpoints" folders and macOS "._name.jpg" resource
// forks are not classes or images.
bool is_hidden(const std::filesystem::path& path) { return path.filename().string().starts_with('.'); }

// Grey <-> RGB so that a folder mixing them (ImageNet holds a few grey and CMYK JPEGs)
// yields the channel count sample_shape asks for, as torchvision's .convert("RGB") does.
Image with_channels(Image image, int64_t channels) {
  if (image.channels == channels) return image;
  Image out(image.height, image.width, channels);
  const int64_t pixel_count = image.height * image.width;
  const uint8_t* in = image.pixels.data();
  uint8_t* q = out.pixels.data();
  if (channels == 3) {
    for (int64_t i = 0; i < pixel_count; ++i, q += 3) q[0] = q[1] = q[2] = in[i];
  } else {
    // ITU-R 601 luma, PIL's "L" conversion.
    for (int64_t i = 0; i < pixel_count; ++i, in += 3)
      q[i] = static_cast<uint8_t>((in[0] * 299 + in[1] * 587 + in[2] * 114 + 500) / 1000);
  }
  return out;
}

}  // namespace

ImageFolder::ImageFolder(const std::filesystem::path& root, Transforms transforms, std::vector<int64_t> sample_shape)
    : root_(root), transforms_(std::move(transforms)), sample_shape_(std::move(sample_shape)) {
  KILN_CHECK(!sample_shape_.empty() && std::all_of(sample_shape_.begin(), sample_shape_.end(),
                                                   [](int64_t d) { return d > 0; }),
             "ImageFolder: {}: bad sample_shape {}", root_.string(), shape_str(sample_shape_));
  std::error_code error;
  KILN_CHECK(std::filesystem::is_directory(root_, error), "ImageFolder: {} is not a folder{}", root_.string(),
             error ? ": " + error.message() : "");
  try {
    for (const auto& entry : std::filesystem::directory_iterator(root_))
      if (entry.is_directory() && !is_hidden(entry.path())) classes_.push_back(entry.path().filename().string());
    std::sort(classes_.begin(), classes_.end());
    // Images may sit in sub-folders of a class folder too, as with torchvision.
    for (size_t label = 0; label < classes_.size(); ++label) {
      std::vector<std::filesystem::path> images;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(root_ / classes_[label]))
        if (entry.is_regular_file() && is_jpeg_name(entry.path()) && !is_hidden(entry.path()))
          images.push_back(entry.path());
      std::sort(images.begin(), images.end());
      files_.insert(files_.end(), images.begin(), images.end());
      labels_.insert(labels_.end(), images.size(), static_cast<int64_t>(label));
    }
  } catch (const std::filesystem::filesystem_error& e) {
    fail("ImageFolder: cannot list {}: {}", root_.string(), e.what());
  }
  KILN_CHECK(!files_.empty(), "ImageFolder: {} holds no .jpg or .jpeg images in class sub-folders ({} folders)",
             root_.string(), classes_.size());
}

const std::filesystem::path& ImageFolder::file(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "ImageFolder::file: index {} outside [0, {})", index, size());
  return files_[static_cast<size_t>(index)];
}

Sample ImageFolder::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < size(), "ImageFolder::get: index {} outside [0, {}) in {}", index, size(),
             root_.string());
  const std::filesystem::path& path = files_[static_cast<size_t>(index)];
  Image image;
  try {
    image = read_jpeg(path);
  } catch (const Error& e) {
    throw BadSample(fmt::format("ImageFolder: sample {}: {}", index, e.what()));
  }
  if (sample_shape_.size() == 3 && (sample_shape_[0] == 1 || sample_shape_[0] == 3))
    image = with_channels(std::move(image), sample_shape_[0]);
  Tensor input;
  try {
    input = transforms_(image, rng);
  } catch (const ImageTooLarge& e) {  // a 65500x1 strip resized to 512 high, say
    throw BadSample(fmt::format("ImageFolder: sample {} ({}): {}", index, path.string(), e.what()));
  }
  KILN_CHECK(input.shape() == sample_shape_,
             "ImageFolder: the transforms made {} ({}x{}x{}) into {}, not the sample_shape {}; "
             "add resize / center_crop steps that give that size",
             path.string(), image.height, image.width, image.channels, shape_str(input.shape()),
             shape_str(sample_shape_));
  return Sample{std::move(input), labels_[static_cast<size_t>(index)]};
}

std::string ImageFolder::describe() const {
  return fmt::format("image folder {}: {} samples, {} classes, {}", root_.string(), size(), num_classes(),
                     shape_str(sample_shape_));
}

}  // namespace kiln::data
