#pragma once
// Loader: batches of a Dataset, optionally shuffled, loaded by worker threads ahead of use.
//
//   data::Loader loader(dataset, {.batch_size = 64, .shuffle = true, .workers = 4, .seed = 1});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch)
//     for (data::Batch& batch : loader.epoch(epoch)) train_step(batch.input, batch.target);
//
// Determinism: epoch e's order is a permutation drawn from (seed, e) alone, and sample i's
// random transforms use SampleRng(seed, e, i), so the batches are the same for any worker
// count. Batches come out in order; workers load up to `prefetch` batches ahead each.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cuda.h"
#include "data/dataset.h"

namespace kiln::data {

// Bounds far above any machine's cores, which keep workers * prefetch (the batches loaded
// ahead) from overflowing.
inline constexpr int64_t kMaxLoaderWorkers = 4096;
inline constexpr int64_t kMaxLoaderPrefetch = 1024;

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;  // drop the last batch of an epoch when it is short
  int64_t workers = 0;     // loading threads; 0 loads in the calling thread
  int64_t prefetch = 2;    // batches loaded ahead, per worker
  uint64_t seed = 0;
  // Skip samples whose get() throws BadSample (counted in Loader::skipped()) instead of
  // rethrowing the error; a batch then holds fewer samples.
  bool skip_bad_samples = false;
  // Batches in page-locked memory (cuda::empty_pinned), so that copying them to a GPU is
  // asynchronous and runs at the link's full speed; where CUDA is not available, ordinary
  // memory (Loader::pinned() says which). Like PyTorch's pin_memory.
  bool pin_memory = false;
  // Data parallel (data/distributed_sampler.h): batch_size is the global batch over
  // world_size ranks, and each batch holds this rank's slice of it; a last global batch
  // with fewer samples than ranks is dropped. The order stays one process's.
  int64_t rank = 0;
  int64_t world_size = 1;
  // Token-sequence data sets (Dataset::padding_id()): 0 pads every batch to the full length
  // sample_shape()[0]; k > 0 pads it to its longest sequence rounded up to a multiple of k
  // (at most the full length), so that batch lengths take at most ceil(full / k) values and
  // a compiled step sees a bounded number of shapes.
  int64_t pad_multiple = 0;
};

struct Batch {
  Tensor input;                  // f32 [n, ...sample_shape]; token sequences i64 [n, length]
  Tensor target;                 // i64 [n]; per-token targets i64 [n, length], padding kIgnoreIndex
  Tensor mask;                   // token sequences: i64 [n, length], 1 a token, 0 padding
  std::vector<int64_t> indices;  // the dataset indices of the samples, in batch order
  int64_t epoch = 0;
  int64_t index = 0;             // position of the batch in its epoch, from 0
  int64_t global_size = 0;       // samples in the global batch over all ranks (size() on one)
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

class Loader {
 public:
  // Throws kiln::Error for a null dataset, batch_size < 1, workers outside [0,
  // kMaxLoaderWorkers], prefetch outside [1, kMaxLoaderPrefetch] or pad_multiple < 0; a
  // worker thread that cannot start is a kiln::Error too.
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }
  // Whether batches are in pinned memory (options().pin_memory and CUDA available).
  bool pinned() const { return options_.pin_memory && cuda::is_available(); }
  // Batches per epoch: ceil(size / batch_size), or floor with drop_last (with world_size >
  // 1, a last batch smaller than world_size is dropped too).
  int64_t batches_per_epoch() const;
  // The dataset indices of epoch e in the order they are served.
  std::vector<int64_t> order(int64_t epoch) const;

  class Epoch;
  // The batches of epoch `epoch`, from batch `start` on (resuming mid-epoch). Only one
  // Epoch of a Loader may be iterated at a time.
  Epoch epoch(int64_t epoch, int64_t start = 0);
  // Samples skipped as bad since the loader was made.
  int64_t skipped() const;

 private:
  struct State;
  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  std::shared_ptr<State> state_;
  friend class Epoch;
};

// A single pass over batches; iterate it once with a range-for. Destroying it mid-way stops
// the workers.
class Loader::Epoch {
 public:
  class Iterator;
  Epoch(Epoch&&) noexcept;
  ~Epoch();
  Iterator begin();
  Iterator end();

 private:
  friend class Loader;
  struct Impl;
  explicit Epoch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Loader::Epoch::Iterator {
 public:
  Batch& operator*() { return *batch_; }
  Batch* operator->() { return batch_; }
  Iterator& operator++();
  bool operator==(const Iterator& other) const { return batch_ == other.batch_; }

 private:
  friend class Loader::Epoch;
  Iterator(Loader::Epoch::Impl* epoch, Batch* batch) : epoch_(epoch), batch_(batch) {}
  Loader::Epoch::Impl* epoch_;
  Batch* batch_;  // null at the end
};

}  // namespace kiln::data
