#pragma once
// Data parallel: which samples each rank loads. Every rank draws the same permutation of
// an epoch (the one a single process's Loader with the same seed serves), cuts it into the
// same global batches of batch_size, and takes its own contiguous, balanced slice of each:
// ranks 0..W-1 hold the global batch in order, the first N % W of them one sample more.
// So W ranks together see exactly the global batches one process would, with the same
// per-sample random transforms (SampleRng(seed, epoch, index)).
//
//   data::DistributedSampler sampler(dataset->size(), {.batch_size = 256, .rank = r, .world_size = W,
//                                                      .shuffle = true, .seed = 0});
//   sampler.set_epoch(e);
//   for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b) load(sampler.shard(b));
//
// Loader does this itself with LoaderOptions{.rank, .world_size} (data/loader.h).
//
// A last global batch with fewer samples than ranks would leave a rank with none, and a
// rank without a batch would stop calling collectives: it is dropped on every rank.
#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::data {

// The order of epoch `epoch`'s dataset indices: 0..n-1, or (shuffle) a Fisher-Yates
// permutation drawn from (seed, epoch) alone. Loader::order is this.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// [first, last) of rank's slice of n samples cut over world ranks: balanced and in rank order.
std::pair<int64_t, int64_t> shard_range(int64_t n, int64_t rank, int64_t world_size);

struct DistributedSamplerOptions {
  int64_t batch_size = 1;  // the global batch, over all ranks
  int64_t rank = 0;
  int64_t world_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // drop the last global batch when it is short
};

class DistributedSampler {
 public:
  // Throws kiln::Error for size < 0, batch_size < 1, world_size < 1, rank outside [0,
  // world_size) or batch_size < world_size (a global batch must give every rank a sample).
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);

  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  const DistributedSamplerOptions& options() const { return options_; }

  // Global batches per epoch (the same on every rank).
  int64_t batches_per_epoch() const;
  // The dataset indices of global batch b of this epoch, as one process would load them.
  std::vector<int64_t> global_batch(int64_t b) const;
  // This rank's slice of global batch b.
  std::vector<int64_t> shard(int64_t b) const;
  // All of this rank's indices this epoch, batch after batch.
  std::vector<int64_t> indices() const;

 private:
  int64_t size_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

// Global batches of batch_size over n samples that give each of world_size ranks at least
// one sample: the full ones, and the last short one when it is kept and has world_size or more.
int64_t sharded_batches(int64_t n, int64_t batch_size, int64_t world_size, bool drop_last);

}  // namespace kiln::data
