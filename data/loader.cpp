#include "data/loader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "core/cuda.h"
#include "core/ops/factory.h"
#include "data/distributed_sampler.h"

namespace kiln::data {

struct Loader::State {
  std::atomic<int64_t> skipped = 0;
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options), state_(std::make_shared<State>()) {
  KILN_CHECK(dataset_ != nullptr, "Loader: the dataset is null");
  KILN_CHECK(options_.batch_size >= 1, "Loader: batch_size {} must be at least 1",
             options_.batch_size);
  KILN_CHECK(options_.workers >= 0 && options_.workers <= kMaxLoaderWorkers,
             "Loader: workers {} must be between 0 and {}", options_.workers, kMaxLoaderWorkers);
  KILN_CHECK(options_.prefetch >= 1 && options_.prefetch <= kMaxLoaderPrefetch,
             "Loader: prefetch {} must be between 1 and {}", options_.prefetch, kMaxLoaderPrefetch);
  KILN_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "Loader: rank {} of world_size {}: need world_size >= 1 and 0 <= rank < world_size", options_.rank,
             options_.world_size);
  KILN_CHECK(options_.pad_multiple >= 0,
             "Loader: pad_multiple {} must be 0 (pad to the full length) or more",
             options_.pad_multiple);
  KILN_CHECK(options_.batch_size >= options_.world_size,
             "Loader: a global batch_size of {} cannot give each of {} ranks a sample", options_.batch_size,
             options_.world_size);
}

Loader::~Loader() = default;

int64_t Loader::batches_per_epoch() const {
  // No n + batch_size - 1: that overflows for a batch_size near INT64_MAX.
  return sharded_batches(dataset_->size(), options_.batch_size, options_.world_size, options_.drop_last);
}

std::vector<int64_t> Loader::order(int64_t epoch) const {
  KILN_CHECK(epoch >= 0, "Loader::order: epoch {} must be 0 or more", epoch);
  return epoch_order(dataset_->size(), options_.shuffle, options_.seed, epoch);
}

int64_t Loader::skipped() const { return state_->skipped.load(); }

// One pass: the order, the batch the consumer holds, and (with workers) the threads and
// the batches they have loaded ahead, keyed by batch number.
struct Loader::Epoch::Impl {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  std::shared_ptr<Loader::State> state;
  int64_t epoch = 0;
  std::vector<int64_t> order;
  std::vector<int64_t> sample_shape;
  int64_t end_batch = 0;
  int64_t next_batch = 0;  // the next batch the consumer takes
  bool started = false;
  bool failed = false;
  Batch current;

  // Worker state: everything below is guarded by `mutex`, except `stop`, which loading
  // threads also poll between samples.
  struct Loaded {
    std::optional<Batch> batch;  // empty when every sample of the batch was skipped
    std::exception_ptr error;
  };
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::condition_variable loaded_cv;  // the consumer waits for its batch
  std::condition_variable space_cv;   // workers wait to be less far ahead
  std::map<int64_t, Loaded> loaded;
  int64_t next_claim = 0;     // the next batch number a worker takes
  int64_t consumer_next = 0;  // the batch the consumer waits for or takes next
  std::atomic<bool> stop = false;

  ~Impl() { stop_workers(); }

  int64_t window() const { return options.workers * options.prefetch; }

  Tensor new_tensor(const Shape& shape, DType dtype) const {
    return options.pin_memory && cuda::is_available() ? cuda::empty_pinned(shape, dtype)
                                                      : empty(shape, {.dtype = dtype});
  }

  // Samples of one fixed shape (images) stacked: f32 [n, ...sample_shape], labels i64 [n].
  Batch collate_fixed(const std::vector<Sample>& samples,
                      const std::vector<int64_t>& indices) const {
    Shape batch_shape = sample_shape;
    batch_shape.insert(batch_shape.begin(), static_cast<int64_t>(samples.size()));
    Batch batch;
    const Shape target_shape{static_cast<int64_t>(samples.size())};
    batch.input = new_tensor(batch_shape, DType::f32);
    batch.target = new_tensor(target_shape, DType::i64);
    // Plain memcpy rather than tensor ops: this runs in worker threads, and the ops may
    // start OpenMP teams of their own.
    auto* input = static_cast<char*>(batch.input.data_ptr());
    int64_t* target = batch.target.data_ptr<int64_t>();
    const int64_t num_classes = dataset->num_classes();
    const size_t sample_bytes = static_cast<size_t>(numel_of(sample_shape)) * sizeof(float);
    for (size_t s = 0; s < samples.size(); ++s) {
      const Tensor& x = samples[s].input;
      KILN_CHECK(!samples[s].target.defined(),
                 "Loader: sample {} has per-token targets, but the dataset is not a token-sequence "
                 "data set "
                 "(padding_id() is empty)",
                 indices[s]);
      KILN_CHECK(x.defined() && x.dtype() == DType::f32 && x.device().is_cpu() &&
                     x.shape() == sample_shape,
                 "Loader: sample {} is {}, but the dataset's sample_shape() is f32[{}] cpu",
                 indices[s], x.defined() ? x.meta_str() : "undefined",
                 fmt::join(sample_shape, ","));
      const Tensor contiguous = x.contiguous();
      std::memcpy(input + s * sample_bytes, contiguous.data_ptr(), sample_bytes);
      const int64_t label = samples[s].label;
      KILN_CHECK(label >= 0 && label < num_classes,
                 "Loader: sample {} has label {}, outside [0, {})", indices[s], label, num_classes);
      target[s] = label;
    }
    return batch;
  }

  // Token sequences (i64 [length] each) padded to one length: input and mask i64 [n, L],
  // target i64 [n] (labels) or [n, L] (per-token targets, kIgnoreIndex on padding).
  Batch collate_sequences(const std::vector<Sample>& samples,
                          const std::vector<int64_t>& indices) const {
    KILN_CHECK(sample_shape.size() == 1 && sample_shape[0] >= 1,
               "Loader: a token-sequence data set's sample_shape() must be [max_length], not [{}]",
               fmt::join(sample_shape, ","));
    const int64_t full = sample_shape[0];
    const int64_t num_classes = dataset->num_classes();
    const bool per_token = samples.front().target.defined();
    int64_t longest = 0;
    for (size_t s = 0; s < samples.size(); ++s) {
      const Tensor& x = samples[s].input;
      KILN_CHECK(x.defined() && x.dtype() == DType::i64 && x.device().is_cpu() && x.dim() == 1 &&
                     x.shape()[0] >= 1 && x.shape()[0] <= full,
                 "Loader: sample {} is {}, but a token-sequence data set's samples are i64[length] "
                 "cpu with "
                 "1 <= length <= {}",
                 indices[s], x.defined() ? x.meta_str() : "undefined", full);
      const Tensor& t = samples[s].target;
      KILN_CHECK(t.defined() == per_token,
                 "Loader: sample {} {} per-token targets but sample {} {}: a batch cannot mix them",
                 indices[s], t.defined() ? "has" : "lacks", indices[0],
                 per_token ? "has" : "lacks");
      KILN_CHECK(
          !per_token || (t.dtype() == DType::i64 && t.device().is_cpu() && t.shape() == x.shape()),
          "Loader: sample {}'s per-token targets are {}, but its input is {}", indices[s],
          per_token ? t.meta_str() : "", x.meta_str());
      longest = std::max(longest, x.shape()[0]);
    }
    const int64_t k = options.pad_multiple;
    // (longest / k + 1) * k rather than longest + k - 1, which overflows for a huge k.
    const int64_t length =
        k == 0 ? full : std::min(full, longest % k == 0 ? longest : (longest / k + 1) * k);
    const auto n = static_cast<int64_t>(samples.size());
    const int64_t pad = *dataset->padding_id();
    Batch batch;
    batch.input = new_tensor({n, length}, DType::i64);
    batch.mask = new_tensor({n, length}, DType::i64);
    batch.target = new_tensor(per_token ? Shape{n, length} : Shape{n}, DType::i64);
    int64_t* input = batch.input.data_ptr<int64_t>();
    int64_t* mask = batch.mask.data_ptr<int64_t>();
    int64_t* target = batch.target.data_ptr<int64_t>();
    for (int64_t s = 0; s < n; ++s) {
      const Tensor x = samples[static_cast<size_t>(s)].input.contiguous();
      const int64_t len = x.shape()[0];
      const int64_t* ids = x.data_ptr<int64_t>();
      int64_t* row = input + s * length;
      std::copy(ids, ids + len, row);
      std::fill(row + len, row + length, pad);
      std::fill(mask + s * length, mask + s * length + len, int64_t{1});
      std::fill(mask + s * length + len, mask + (s + 1) * length, int64_t{0});
      if (per_token) {
        const Tensor t = samples[static_cast<size_t>(s)].target.contiguous();
        const int64_t* values = t.data_ptr<int64_t>();
        for (int64_t i = 0; i < len; ++i)
          KILN_CHECK(values[i] == kIgnoreIndex || (values[i] >= 0 && values[i] < num_classes),
                     "Loader: sample {} has target {} at token {}, neither {} nor in [0, {})",
                     indices[static_cast<size_t>(s)], values[i], i, kIgnoreIndex, num_classes);
        std::copy(values, values + len, target + s * length);
        std::fill(target + s * length + len, target + (s + 1) * length, kIgnoreIndex);
      } else {
        const int64_t label = samples[static_cast<size_t>(s)].label;
        KILN_CHECK(label >= 0 && label < num_classes,
                   "Loader: sample {} has label {}, outside [0, {})",
                   indices[static_cast<size_t>(s)], label, num_classes);
        target[s] = label;
      }
    }
    return batch;
  }

  // Loads batch `b` (its samples in order); empty when all its samples were bad and skipped,
  // or when the workers were told to stop.
  std::optional<Batch> load_batch(int64_t b) {
    const int64_t n = static_cast<int64_t>(order.size());
    // b < batches_per_epoch(), so first < n; last without first + batch_size (overflow).
    const int64_t global_first = b * options.batch_size;
    const int64_t global_size = std::min(options.batch_size, n - global_first);
    const auto [shard_first, shard_last] = shard_range(global_size, options.rank, options.world_size);
    const int64_t first = global_first + shard_first, last = global_first + shard_last;
    std::vector<int64_t> indices;
    std::vector<Sample> samples;
    indices.reserve(static_cast<size_t>(last - first));
    samples.reserve(static_cast<size_t>(last - first));
    for (int64_t k = first; k < last; ++k) {
      if (stop.load(std::memory_order_relaxed)) return std::nullopt;
      const int64_t index = order[static_cast<size_t>(k)];
      SampleRng rng(options.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
      try {
        samples.push_back(dataset->get(index, rng));
      } catch (const BadSample&) {
        if (!options.skip_bad_samples) throw;
        state->skipped.fetch_add(1);
        continue;
      }
      indices.push_back(index);
    }
    if (samples.empty()) return std::nullopt;

    Batch batch = dataset->padding_id() ? collate_sequences(samples, indices)
                                        : collate_fixed(samples, indices);
    batch.indices = std::move(indices);
    batch.epoch = epoch;
    batch.index = b;
    batch.global_size = global_size;
    return batch;
  }

  void start_workers() {
    next_claim = consumer_next = next_batch;
    threads.reserve(static_cast<size_t>(options.workers));
    try {
      for (int64_t w = 0; w < options.workers; ++w) threads.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      const size_t started = threads.size();
      stop_workers();
      fail("Loader: cannot start worker thread {} of {}: {}", started + 1, options.workers, e.what());
    } catch (...) {
      stop_workers();
      throw;
    }
  }

  void work() {
    while (true) {
      int64_t b;
      {
        std::unique_lock lock(mutex);
        // Bounded memory: never more than window() batches past the one the consumer waits for.
        space_cv.wait(lock, [&] {
          return stop.load() || next_claim >= end_batch || next_claim < consumer_next + window();
        });
        if (stop.load() || next_claim >= end_batch) return;
        b = next_claim++;
      }
      Loaded result;
      try {
        result.batch = load_batch(b);
      } catch (...) {
        // Carried to the consumer and rethrown at this batch's turn.
        result.error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex);
        loaded.insert_or_assign(b, std::move(result));
      }
      loaded_cv.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex);
      stop.store(true);
    }
    space_cv.notify_all();
    for (std::thread& t : threads)
      if (t.joinable()) t.join();
    threads.clear();
    loaded.clear();
  }

  // Batch `b` from the workers; rethrows the error a worker met loading it.
  std::optional<Batch> take_loaded(int64_t b) {
    Loaded result;
    {
      std::unique_lock lock(mutex);
      consumer_next = b;
      loaded_cv.wait(lock, [&] { return loaded.count(b) != 0; });
      auto node = loaded.extract(b);
      result = std::move(node.mapped());
      consumer_next = b + 1;
    }
    space_cv.notify_all();
    if (result.error) std::rethrow_exception(result.error);
    return std::move(result.batch);
  }

  // The next non-empty batch, or null at the end of the epoch. A batch whose samples were
  // all skipped as bad is skipped entirely: there is nothing to train on, and an empty
  // [0, ...] batch would only trip up the step that receives it.
  Batch* advance() {
    if (failed) return nullptr;
    try {
      while (next_batch < end_batch) {
        const int64_t b = next_batch++;
        std::optional<Batch> batch = options.workers == 0 ? load_batch(b) : take_loaded(b);
        if (batch) {
          current = std::move(*batch);
          return &current;
        }
      }
    } catch (...) {
      // The pass ends with the error; stop loading what nobody will take.
      failed = true;
      stop_workers();
      throw;
    }
    stop_workers();
    return nullptr;
  }
};

Loader::Epoch Loader::epoch(int64_t epoch, int64_t start) {
  const int64_t batches = batches_per_epoch();
  KILN_CHECK(epoch >= 0, "Loader::epoch: epoch {} must be 0 or more", epoch);
  KILN_CHECK(start >= 0 && start <= batches,
             "Loader::epoch: start batch {} outside [0, {}] ({} batches per epoch)", start, batches,
             batches);
  auto impl = std::make_unique<Epoch::Impl>();
  impl->dataset = dataset_;
  impl->options = options_;
  impl->state = state_;
  impl->epoch = epoch;
  impl->order = order(epoch);
  impl->sample_shape = dataset_->sample_shape();
  impl->end_batch = batches;
  impl->next_batch = start;
  return Epoch(std::move(impl));
}

Loader::Epoch::Epoch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::Epoch::Epoch(Epoch&&) noexcept = default;
Loader::Epoch::~Epoch() = default;

Loader::Epoch::Iterator Loader::Epoch::begin() {
  KILN_CHECK(impl_ != nullptr, "Loader::Epoch::begin: the epoch was moved from");
  KILN_CHECK(!impl_->started,
             "Loader::Epoch::begin: an Epoch is a single pass; call loader.epoch(e) again");
  impl_->started = true;
  if (impl_->options.workers > 0 && impl_->next_batch < impl_->end_batch) impl_->start_workers();
  return Iterator(impl_.get(), impl_->advance());
}

Loader::Epoch::Iterator Loader::Epoch::end() { return Iterator(impl_.get(), nullptr); }

Loader::Epoch::Iterator& Loader::Epoch::Iterator::operator++() {
  KILN_CHECK(batch_ != nullptr, "Loader::Epoch::Iterator: incremented past the end");
  batch_ = nullptr;  // stays at the end if loading the next batch throws
  batch_ = epoch_->advance();
  return *this;
}

}  // namespace kiln::data
