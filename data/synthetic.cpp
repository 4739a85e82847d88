#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ops/factory.h"
#include "data/datasets.h"
#include "core/philox.h"

namespace kiln::data {

namespace {

// Separate Philox keys for the label, class-mean and noise hashes, so that they are
// unrelated even though all three are keyed by the same seed.
constexpr uint64_t kLabelKey = 0x73796e2d6c61626cull;
constexpr uint64_t kMeanKey = 0x73796e2d6d65616eull;
constexpr uint64_t kNoiseKey = 0x73796e2d6e6f6973ull;

uint64_t hash(uint64_t key, uint64_t seed, uint64_t value) {
  return philox::bits64(philox::random4(key ^ seed, value));
}

}  // namespace

SyntheticDataset::SyntheticDataset(SyntheticOptions options) : options_(options) {
  KILN_CHECK(options_.size >= 0 && options_.num_classes >= 1 && options_.channels >= 1 &&
                 options_.image_size >= 1,
             "SyntheticDataset: bad options: size {}, num_classes {}, channels {}, image_size {} "
             "(size must be 0 or more, the others at least 1)",
             options_.size, options_.num_classes, options_.channels, options_.image_size);
}

std::vector<int64_t> SyntheticDataset::sample_shape() const {
  return {options_.channels, options_.image_size, options_.image_size};
}

// Sample i is a pure function of (seed, i), so `rng` goes unused: the loader's per-epoch
// stream would otherwise make the same index a different image each epoch.
Sample SyntheticDataset::get(int64_t index, SampleRng& /*rng*/) const {
  KILN_CHECK(index >= 0 && index < options_.size, "SyntheticDataset::get: index {} outside [0, {})",
             index, options_.size);
  const uint64_t seed = options_.seed;
  const auto label = static_cast<int64_t>(hash(kLabelKey, seed, static_cast<uint64_t>(index)) %
                                          static_cast<uint64_t>(options_.num_classes));
  const int64_t plane = options_.image_size * options_.image_size;
  Tensor input = empty(sample_shape());
  float* out = input.data_ptr<float>();
  // The sample's noise stream: its own key, one Philox block per 8 pixels (16 bits each).
  const uint64_t noise_key = hash(kNoiseKey, seed, static_cast<uint64_t>(index));
  uint64_t counter = 0;
  for (int64_t c = 0; c < options_.channels; ++c) {
    // The class mean of channel c, in [-1, 1).
    const uint64_t mean_bits =
        hash(kMeanKey, seed,
             static_cast<uint64_t>(label) * static_cast<uint64_t>(options_.channels) +
                 static_cast<uint64_t>(c));
    const float mean = static_cast<float>(mean_bits >> 40) * 0x1.0p-23f - 1.0f;
    float* q = out + c * plane;
    // Uniform noise in [-1, 1) around the mean: 16-bit resolution is plenty for noise.
    constexpr float kScale = 0x1.0p-15f;
    int64_t i = 0;
    for (; i + 8 <= plane; i += 8) {
      const philox::Block block = philox::random4(noise_key, counter++);
      for (int w = 0; w < 4; ++w) {
        q[i + 2 * w] = mean + static_cast<float>(block.v[w] & 0xffffu) * kScale - 1.0f;
        q[i + 2 * w + 1] = mean + static_cast<float>(block.v[w] >> 16) * kScale - 1.0f;
      }
    }
    if (i < plane) {
      const philox::Block block = philox::random4(noise_key, counter++);
      for (int k = 0; i < plane; ++i, ++k) {
        const unsigned word = block.v[k / 2];
        q[i] = mean + static_cast<float>(k % 2 == 0 ? word & 0xffffu : word >> 16) * kScale - 1.0f;
      }
    }
  }
  return Sample{std::move(input), label};
}

std::string SyntheticDataset::describe() const {
  return fmt::format("synthetic (seed {}): {} samples, {} classes, [{}]", options_.seed,
                     options_.size, options_.num_classes, fmt::join(sample_shape(), ", "));
}

}  // namespace kiln::data
