#pragma once
// The data sets kiln ships: synthetic ImageNet-shaped noise, Fashion-MNIST from its IDX
// files, image folders of JPEGs, and the generated "shapes" set.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"

namespace kiln::data {

struct SyntheticOptions {
  int64_t size = 1281;        // samples
  int64_t num_classes = 1000;
  int64_t channels = 3;
  int64_t image_size = 224;
  uint64_t seed = 0;
};

// Deterministic ImageNet-shaped samples: label i's images are noise around a per-class
// mean, so a model can learn them; sample i is a pure function of (seed, i).
class SyntheticDataset : public Dataset {
 public:
  explicit SyntheticDataset(SyntheticOptions options);
  int64_t size() const override { return options_.size; }
  int64_t num_classes() const override { return options_.num_classes; }
  std::vector<int64_t> sample_shape() const override;
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  SyntheticOptions options_;
};

// Where Debian's dataset-fashion-mnist package installs the IDX files.
inline const std::filesystem::path kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { train, test };

// Fashion-MNIST (60,000 training and 10,000 test 28x28 grey images, 10 classes) read from
// its IDX files (train-images-idx3-ubyte, ... gzip-compressed or not). Without transforms
// a sample is f32 [1, 28, 28] normalized with the training set's mean and std.
class FashionMnist : public Dataset {
 public:
  // Throws kiln::Error naming the folder and the package to install when files are missing,
  // or the file when one is truncated or has the wrong magic number.
  FashionMnist(const std::filesystem::path& root, Split split, std::optional<Transforms> transforms = {});
  int64_t size() const override;
  int64_t num_classes() const override { return 10; }
  std::vector<int64_t> sample_shape() const override;
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;
  static std::vector<std::string> class_names();

 private:
  Split split_;
  std::optional<Transforms> transforms_;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> images_;  // size() * rows_ * cols_
  std::vector<uint8_t> labels_;
  std::vector<int64_t> shape_;
};

// root/<class>/<image>.jpg|.jpeg: classes are the sub-folder names in sorted order, images
// sorted by path. Images are decoded (libjpeg-turbo) on get(); a corrupt file throws
// BadSample naming it.
class ImageFolder : public Dataset {
 public:
  // Throws kiln::Error when root is missing or holds no class folder with images.
  // `sample_shape` is the shape the transforms produce ([3, size, size]).
  ImageFolder(const std::filesystem::path& root, Transforms transforms, std::vector<int64_t> sample_shape);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  std::vector<int64_t> sample_shape() const override { return sample_shape_; }
  Sample get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;
  const std::vector<std::string>& classes() const { return classes_; }
  const std::filesystem::path& file(int64_t index) const;

 private:
  std::filesystem::path root_;
  Transforms transforms_;
  std::vector<int64_t> sample_shape_;
  std::vector<std::string> classes_;
  std::vector<std::filesystem::path> files_;
  std::vector<int64_t> labels_;
};

struct ShapesOptions {
  int64_t train_per_class = 300;
  int64_t val_per_class = 60;
  int64_t image_size = 64;
  uint64_t seed = 0;
  int quality = 90;  // JPEG quality
};

// The ten classes of the shapes set, in label order.
std::vector<std::string> shapes_classes();
// Writes the shapes set: root/train/<class>/NNNNN.jpg and root/val/<class>/NNNNN.jpg, ten
// classes of coloured geometric shapes (random colour, size, position, rotation) on noisy
// backgrounds. Builds in a temporary sibling folder and renames it into place, so an
// interrupted run leaves no half set; returns immediately when root already holds a
// complete set made with the same options (a stamp file records them).
void generate_shapes(const std::filesystem::path& root, const ShapesOptions& options = {});

}  // namespace kiln::data
