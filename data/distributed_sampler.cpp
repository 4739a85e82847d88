#include "data/distributed_sampler.h"

#include <algorithm>

#include "core/error.h"
#include "data/sample_rng.h"

namespace kiln::data {
namespace {

// The shuffle's own stream: sample streams use (seed, epoch, index) with index < size, so
// the all-ones index never collides with one of them.
constexpr uint64_t kShuffleStream = ~uint64_t{0};

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  KILN_CHECK(epoch >= 0, "epoch_order: epoch {} must be 0 or more", epoch);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  if (!shuffle) return indices;
  // Fisher-Yates from the back: position k swaps with a uniform position in [0, k].
  SampleRng rng(seed, static_cast<uint64_t>(epoch), kShuffleStream);
  for (int64_t k = n - 1; k > 0; --k)
    std::swap(indices[static_cast<size_t>(k)], indices[rng.below(static_cast<uint64_t>(k + 1))]);
  return indices;
}

std::pair<int64_t, int64_t> shard_range(int64_t n, int64_t rank, int64_t world_size) {
  KILN_CHECK(n >= 0 && world_size >= 1 && rank >= 0 && rank < world_size,
             "shard_range: {} samples, rank {} of {}: need n >= 0 and 0 <= rank < world_size", n, rank, world_size);
  const int64_t base = n / world_size, extra = n % world_size;
  const int64_t first = rank * base + std::min(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

int64_t sharded_batches(int64_t n, int64_t batch_size, int64_t world_size, bool drop_last) {
  const int64_t full = n / batch_size, rest = n % batch_size;
  return full + (!drop_last && rest >= world_size ? 1 : 0);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : size_(dataset_size), options_(options) {
  KILN_CHECK(size_ >= 0, "DistributedSampler: dataset size {} must be 0 or more", size_);
  KILN_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "DistributedSampler: rank {} of world_size {}: need world_size >= 1 and 0 <= rank < world_size",
             options_.rank, options_.world_size);
  KILN_CHECK(options_.batch_size >= options_.world_size,
             "DistributedSampler: a global batch of {} cannot give each of {} ranks a sample", options_.batch_size,
             options_.world_size);
  order_ = epoch_order(size_, options_.shuffle, options_.seed, 0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  KILN_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch {} must be 0 or more", epoch);
  epoch_ = epoch;
  order_ = epoch_order(size_, options_.shuffle, options_.seed, epoch);
}

int64_t DistributedSampler::batches_per_epoch() const {
  return sharded_batches(size_, options_.batch_size, options_.world_size, options_.drop_last);
}

std::vector<int64_t> DistributedSampler::global_batch(int64_t b) const {
  KILN_CHECK(b >= 0 && b < batches_per_epoch(), "DistributedSampler: batch {} outside [0, {})", b,
             batches_per_epoch());
  const int64_t first = b * options_.batch_size, last = std::min(size_, first + options_.batch_size);
  return {order_.begin() + first, order_.begin() + last};
}

std::vector<int64_t> DistributedSampler::shard(int64_t b) const {
  const std::vector<int64_t> global = global_batch(b);
  const auto [first, last] = shard_range(static_cast<int64_t>(global.size()), options_.rank, options_.world_size);
  return {global.begin() + first, global.begin() + last};
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < batches_per_epoch(); ++b) {
    const std::vector<int64_t> s = shard(b);
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

}  // namespace kiln::data
