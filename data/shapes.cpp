// The shapes set: ten classes of filled geometric shapes drawn into JPEGs, a small image
// classification task that a CNN learns in minutes and that needs no download.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numbers>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "data/datasets.h"

namespace kiln::data {

namespace {

// In label order, which is also sorted order, so that ImageFolder on a generated split
// numbers the classes the same way.
enum class ShapeKind { circle, cross, diamond, ellipse, hexagon, pentagon, ring, square, star, triangle };
constexpr int kShapeKinds = 10;

constexpr const char* kStampName = "shapes.stamp";

// Unit edge normals of a regular n-gon (n <= 6), spaced 2 pi / n apart.
struct Normals {
  std::array<double, 6> x{}, y{};
};

Normals normals_of(int sides, double offset) {
  Normals normals;
  for (int k = 0; k < sides; ++k) {
    const double angle = offset + 2 * std::numbers::pi * k / sides;
    normals.x[static_cast<size_t>(k)] = std::cos(angle);
    normals.y[static_cast<size_t>(k)] = std::sin(angle);
  }
  return normals;
}

// How many of the n half-planes "p . normal_k <= distance" the point (u, v) lies outside.
int outside_count(const Normals& normals, int sides, double distance, double u, double v) {
  int count = 0;
  for (int k = 0; k < sides; ++k)
    count += u * normals.x[static_cast<size_t>(k)] + v * normals.y[static_cast<size_t>(k)] > distance;
  return count;
}

// One shape in the image: where it is, its size and rotation, and a per-shape proportion
// (the ellipse's and diamond's minor axis, the ring's hole, the cross's arm width).
struct ShapeParams {
  ShapeKind kind;
  double center_x, center_y, radius, cos_angle, sin_angle, proportion;
};

// Whether the point at (u, v), in the shape's own frame with radius 1, is inside it.
bool inside(const ShapeParams& shape, double u, double v) {
  static const Normals triangle = normals_of(3, std::numbers::pi / 3);
  static const Normals pentagon = normals_of(5, std::numbers::pi / 5);
  static const Normals hexagon = normals_of(6, std::numbers::pi / 6);
  static const Normals star = normals_of(5, 0);
  const double r2 = u * u + v * v;
  if (r2 > 1.0) return false;  // every shape fits in the unit circle
  const double p = shape.proportion;
  switch (shape.kind) {
    case ShapeKind::circle: return true;
    case ShapeKind::ring: return r2 >= p * p;
    case ShapeKind::ellipse: return u * u + (v * v) / (p * p) <= 1.0;
    case ShapeKind::square: return std::abs(u) <= 0.7 && std::abs(v) <= 0.7;
    case ShapeKind::diamond: return std::abs(u) + std::abs(v) / p <= 1.0;
    case ShapeKind::cross:
      return (std::abs(u) <= p && std::abs(v) <= 0.95) || (std::abs(v) <= p && std::abs(u) <= 0.95);
    case ShapeKind::triangle: return outside_count(triangle, 3, 0.5, u, v) == 0;
    case ShapeKind::pentagon: return outside_count(pentagon, 5, std::cos(std::numbers::pi / 5), u, v) == 0;
    case ShapeKind::hexagon: return outside_count(hexagon, 6, std::cos(std::numbers::pi / 6), u, v) == 0;
    // The filled pentagram: the five lines joining every other vertex of a pentagon; the
    // inner pentagon is inside all five, the points are outside exactly one.
    case ShapeKind::star: return outside_count(star, 5, std::cos(2 * std::numbers::pi / 5), u, v) <= 1;
  }
  return false;
}

// Noise bytes, eight from each 64 random bits.
class NoiseBytes {
 public:
  explicit NoiseBytes(SampleRng& rng) : rng_(rng) {}
  // Roughly uniform in [-amplitude, amplitude] (amplitude < 128).
  int next(int amplitude) {
    if (left_ == 0) {
      word_ = rng_.bits();
      left_ = 8;
    }
    const auto byte = static_cast<int>(word_ & 0xff);
    word_ >>= 8;
    --left_;
    return byte * (2 * amplitude + 1) / 256 - amplitude;
  }

 private:
  SampleRng& rng_;
  uint64_t word_ = 0;
  int left_ = 0;
};

uint8_t to_byte(double value) { return static_cast<uint8_t>(std::clamp(value + 0.5, 0.0, 255.0)); }

// Draws one image of `kind`: a shape of random colour, size, position and rotation over a
// noisy two-colour gradient. Edges are antialiased with 2x2 samples per pixel.
Image draw_shape(ShapeKind kind, int64_t size, SampleRng& rng) {
  const auto s = static_cast<double>(size);
  std::array<double, 3> background_from{}, background_to{}, fill{};
  for (size_t c = 0; c < 3; ++c) {
    background_from[c] = rng.uniform(0, 256);
    background_to[c] = std::clamp(background_from[c] + rng.uniform(-60, 60), 0.0, 255.0);
  }
  // A fill that stands out from the background: redraw until far enough, else invert.
  for (int attempt = 0;; ++attempt) {
    double distance = 0;
    for (size_t c = 0; c < 3; ++c) {
      fill[c] = attempt < 20 ? rng.uniform(0, 256) : 255 - background_from[c];
      distance += std::abs(fill[c] - (background_from[c] + background_to[c]) / 2);
    }
    if (distance >= 160 || attempt >= 20) break;
  }
  const double gradient_angle = rng.uniform(0, 2 * std::numbers::pi);
  const double gradient_x = std::cos(gradient_angle) / s, gradient_y = std::sin(gradient_angle) / s;

  ShapeParams shape{kind, 0, 0, 0, 0, 0, 0};
  shape.radius = s * rng.uniform(0.28, 0.45);
  shape.center_x = rng.uniform(shape.radius, s - shape.radius);
  shape.center_y = rng.uniform(shape.radius, s - shape.radius);
  // A tilt of at most 20 degrees: with free rotation a square is a diamond of proportion 1,
  // and a small CNN needs many epochs to tell the classes apart at low resolution.
  const double angle = rng.uniform(-std::numbers::pi / 9, std::numbers::pi / 9);
  shape.cos_angle = std::cos(angle);
  shape.sin_angle = std::sin(angle);
  switch (kind) {
    case ShapeKind::ellipse: shape.proportion = rng.uniform(0.4, 0.6); break;
    case ShapeKind::diamond: shape.proportion = rng.uniform(0.5, 0.65); break;
    case ShapeKind::ring: shape.proportion = rng.uniform(0.45, 0.65); break;
    case ShapeKind::cross: shape.proportion = rng.uniform(0.22, 0.32); break;
    default: break;
  }
  // Only pixels near the shape need the inside tests.
  const auto first_row = static_cast<int64_t>(std::max(0.0, shape.center_y - shape.radius - 1));
  const auto last_row = static_cast<int64_t>(std::min(s - 1, shape.center_y + shape.radius + 1));
  const auto first_column = static_cast<int64_t>(std::max(0.0, shape.center_x - shape.radius - 1));
  const auto last_column = static_cast<int64_t>(std::min(s - 1, shape.center_x + shape.radius + 1));
  const double inverse_radius = 1.0 / shape.radius;

  Image image(size, size, 3);
  NoiseBytes noise(rng);
  uint8_t* q = image.pixels.data();
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x, q += 3) {
      int covered = 0;
      if (y >= first_row && y <= last_row && x >= first_column && x <= last_column) {
        for (double sub_y : {0.25, 0.75})
          for (double sub_x : {0.25, 0.75}) {
            const double dx = (static_cast<double>(x) + sub_x - shape.center_x) * inverse_radius;
            const double dy = (static_cast<double>(y) + sub_y - shape.center_y) * inverse_radius;
            covered += inside(shape, dx * shape.cos_angle + dy * shape.sin_angle,
                              dy * shape.cos_angle - dx * shape.sin_angle);
          }
      }
      const double t = std::clamp(
          0.5 + (static_cast<double>(x) + 0.5 - s / 2) * gradient_x + (static_cast<double>(y) + 0.5 - s / 2) * gradient_y,
          0.0, 1.0);
      const double alpha = covered * 0.25;
      for (size_t c = 0; c < 3; ++c) {
        const double background = background_from[c] + t * (background_to[c] - background_from[c]) + noise.next(12);
        const double foreground = fill[c] + noise.next(8);
        q[c] = to_byte(background + alpha * (foreground - background));
      }
    }
  }
  return image;
}

std::string stamp_text(const ShapesOptions& options) {
  return fmt::format("kiln shapes v2\ntrain_per_class {}\nval_per_class {}\nimage_size {}\nseed {}\nquality {}\n",
                     options.train_per_class, options.val_per_class, options.image_size, options.seed,
                     options.quality);
}

// The file's text, or "" when it cannot be read.
std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

void write_bytes(const std::filesystem::path& path, const void* data, size_t size) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr)
    fail("generate_shapes: cannot create {}: {}", path.string(), std::generic_category().message(errno));
  const bool written = std::fwrite(data, 1, size, file) == size;
  const bool closed = std::fclose(file) == 0;
  KILN_CHECK(written && closed, "generate_shapes: cannot write {} ({} bytes)", path.string(), size);
}

// Writes the whole set (stamp last) into `folder`.
void write_set(const std::filesystem::path& folder, const ShapesOptions& options, const std::string& stamp) {
  const std::vector<std::string> classes = shapes_classes();
  const std::array<std::pair<const char*, int64_t>, 2> splits = {{{"train", options.train_per_class},
                                                                   {"val", options.val_per_class}}};
  for (uint64_t split = 0; split < splits.size(); ++split) {
    const auto [split_name, per_class] = splits[split];
    for (int label = 0; label < kShapeKinds; ++label) {
      const std::filesystem::path class_folder = folder / split_name / classes[static_cast<size_t>(label)];
      std::filesystem::create_directories(class_folder);
      for (int64_t i = 0; i < per_class; ++i) {
        // Image i of a class in a split is a pure function of (seed, split, label, i).
        SampleRng rng(options.seed, split, static_cast<uint64_t>(label * per_class + i));
        const Image image = draw_shape(static_cast<ShapeKind>(label), options.image_size, rng);
        const std::vector<uint8_t> bytes = encode_jpeg(image, options.quality);
        write_bytes(class_folder / fmt::format("{:05d}.jpg", i), bytes.data(), bytes.size());
      }
    }
  }
  write_bytes(folder / kStampName, stamp.data(), stamp.size());
}

}  // namespace

std::vector<std::string> shapes_classes() {
  return {"circle", "cross", "diamond", "ellipse", "hexagon", "pentagon", "ring", "square", "star", "triangle"};
}

void generate_shapes(const std::filesystem::path& root, const ShapesOptions& options) {
  KILN_CHECK(options.train_per_class >= 0 && options.val_per_class >= 0 &&
                 options.train_per_class + options.val_per_class > 0 && options.train_per_class < 100000 &&
                 options.val_per_class < 100000,
             "generate_shapes: {} training and {} validation images per class (each 0..99999, not both 0)",
             options.train_per_class, options.val_per_class);
  KILN_CHECK(options.image_size >= 8 && options.image_size <= 4096, "generate_shapes: image_size {} outside 8..4096",
             options.image_size);
  KILN_CHECK(options.quality >= 1 && options.quality <= 100, "generate_shapes: quality {} outside 1..100",
             options.quality);
  std::filesystem::path target = root.lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "shapes/" names "shapes"
  KILN_CHECK(!target.empty() && target.filename() != "." && target.filename() != "..",
             "generate_shapes: {} does not name a folder to create", root.string());
  const std::string stamp = stamp_text(options);
  const auto is_complete = [&] { return read_text(target / kStampName) == stamp; };
  if (is_complete()) return;

  static std::atomic<uint64_t> counter{0};
  std::filesystem::path building = target;
  building += fmt::format(".tmp-{}-{}", static_cast<long>(::getpid()), counter.fetch_add(1));
  try {
    // Never delete a folder we did not make: replace only an empty one or an older set.
    if (std::filesystem::exists(target) && !std::filesystem::exists(target / kStampName))
      KILN_CHECK(std::filesystem::is_directory(target) && std::filesystem::is_empty(target),
                 "generate_shapes: {} exists and is not a shapes set (it has no {}); remove it or choose another "
                 "folder",
                 target.string(), kStampName);
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    std::filesystem::remove_all(building);
    write_set(building, options, stamp);
    if (is_complete()) {  // another process finished the same set meanwhile
      std::filesystem::remove_all(building);
      return;
    }
    std::filesystem::remove_all(target);
    std::error_code error;
    std::filesystem::rename(building, target, error);
    if (error) {
      std::filesystem::remove_all(building);
      if (is_complete()) return;  // lost the race to another process making the same set
      fail("generate_shapes: cannot rename {} to {}: {}", building.string(), target.string(), error.message());
    }
  } catch (const std::filesystem::filesystem_error& e) {
    std::error_code ignored;
    std::filesystem::remove_all(building, ignored);
    fail("generate_shapes: {}: {}", target.string(), e.what());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(building, ignored);
    throw;
  }
}

}  // namespace kiln::data
