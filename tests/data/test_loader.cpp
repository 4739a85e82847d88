// The Loader: batching, shuffling, determinism across worker counts, resuming, bad samples,
// errors carried out of worker threads, and stopping early.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "data/loader.h"
#include "testing.h"

using namespace kiln;
using data::Batch;
using data::Loader;
using data::LoaderOptions;

namespace {

// Sample i is a [2, 3] tensor of i * 100 + k + u, k the element number and u one uniform
// draw of the sample's rng, so a batch shows both which sample it holds and which stream
// its random transform used. Labels are i % 3. Indices in `bad` throw BadSample, in
// `broken` a plain kiln::Error.
class CountingDataset : public data::Dataset {
 public:
  explicit CountingDataset(int64_t size, std::set<int64_t> bad = {}, std::set<int64_t> broken = {})
      : size_(size), bad_(std::move(bad)), broken_(std::move(broken)) {}
  int64_t size() const override { return size_; }
  int64_t num_classes() const override { return 3; }
  std::vector<int64_t> sample_shape() const override { return {2, 3}; }
  data::Sample get(int64_t index, data::SampleRng& rng) const override {
    calls.fetch_add(1);
    if (bad_.count(index)) throw data::BadSample(fmt::format("broken sample {}", index));
    if (broken_.count(index)) throw Error(fmt::format("disk on fire at {}", index));
    const double u = rng.uniform();
    std::vector<float> v(6);
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = static_cast<float>(index * 100 + static_cast<int64_t>(k) + u);
    return {testing::f32s(v, {2, 3}), index % 3};
  }
  std::string describe() const override { return "counting"; }
  mutable std::atomic<int64_t> calls = 0;

 private:
  int64_t size_;
  std::set<int64_t> bad_, broken_;
};

std::vector<Batch> collect(Loader& loader, int64_t epoch, int64_t start = 0) {
  std::vector<Batch> batches;
  for (Batch& batch : loader.epoch(epoch, start)) batches.push_back(batch);
  return batches;
}

std::vector<int64_t> sizes_of(const std::vector<Batch>& batches) {
  std::vector<int64_t> sizes;
  for (const Batch& b : batches) sizes.push_back(b.size());
  return sizes;
}

void require_same_batches(const std::vector<Batch>& actual, const std::vector<Batch>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t b = 0; b < actual.size(); ++b) {
    INFO("batch " << b);
    REQUIRE(actual[b].indices == expected[b].indices);
    REQUIRE(actual[b].index == expected[b].index);
    REQUIRE(actual[b].epoch == expected[b].epoch);
    KILN_CHECK_EQUAL(actual[b].input, expected[b].input);
    KILN_CHECK_EQUAL(actual[b].target, expected[b].target);
  }
}

}  // namespace

TEST_CASE("Loader batches are identical for 0 1 and 3 workers", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(23);
  const LoaderOptions base{.batch_size = 4, .shuffle = true, .seed = 7};
  Loader reference(dataset, base);
  REQUIRE(reference.batches_per_epoch() == 6);
  for (int64_t epoch : {0, 1}) {
    const std::vector<Batch> expected = collect(reference, epoch);
    REQUIRE(sizes_of(expected) == std::vector<int64_t>{4, 4, 4, 4, 4, 3});
    // Every sample holds its own values and the draw of SampleRng(seed, epoch, index).
    const std::vector<int64_t> order = reference.order(epoch);
    for (size_t b = 0; b < expected.size(); ++b) {
      REQUIRE(expected[b].index == static_cast<int64_t>(b));
      REQUIRE(expected[b].input.shape() == Shape{expected[b].size(), 2, 3});
      REQUIRE(expected[b].target.dtype() == DType::i64);
      for (int64_t s = 0; s < expected[b].size(); ++s) {
        const int64_t index = expected[b].indices[static_cast<size_t>(s)];
        REQUIRE(index == order[b * 4 + static_cast<size_t>(s)]);
        data::SampleRng rng(7, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
        KILN_CHECK_EQUAL(expected[b].input[s], dataset->get(index, rng).input);
        REQUIRE(testing::at(expected[b].target, {s}) == static_cast<double>(index % 3));
      }
    }
    for (int64_t workers : {1, 3}) {
      INFO("epoch " << epoch << ", " << workers << " workers");
      LoaderOptions options = base;
      options.workers = workers;
      options.prefetch = workers == 1 ? 1 : 2;
      Loader loader(dataset, options);
      require_same_batches(collect(loader, epoch), expected);
    }
  }
}

TEST_CASE("Loader pin_memory gives the same batches, pinned where CUDA is available", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(23);
  const LoaderOptions base{.batch_size = 4, .shuffle = true, .seed = 7};
  Loader reference(dataset, base);
  for (int64_t workers : {0, 2}) {
    INFO(workers << " workers");
    LoaderOptions options = base;
    options.workers = workers;
    options.pin_memory = true;
    Loader pinned(dataset, options);
    CHECK(pinned.pinned() == cuda::is_available());  // elsewhere ordinary memory
    const std::vector<Batch> batches = collect(pinned, 0);
    require_same_batches(batches, collect(reference, 0));
    for (const Batch& b : batches) {
      CHECK(cuda::is_pinned(b.input) == cuda::is_available());
      CHECK(cuda::is_pinned(b.target) == cuda::is_available());
    }
  }
  CHECK_FALSE(Loader(dataset, base).pinned());
}

TEST_CASE("Loader shuffle is a permutation that changes with epoch and seed", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(50);
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  REQUIRE(Loader(dataset, {.batch_size = 8}).order(3) == identity);

  Loader loader(dataset, {.batch_size = 8, .shuffle = true, .seed = 1});
  const std::vector<int64_t> first = loader.order(0);
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted == identity);
  REQUIRE(first != identity);
  REQUIRE(loader.order(0) == first);
  REQUIRE(loader.order(1) != first);
  REQUIRE(Loader(dataset, {.batch_size = 8, .shuffle = true, .seed = 2}).order(0) != first);
  REQUIRE_THROWS_AS(loader.order(-1), Error);
}

TEST_CASE("Loader drop_last and the short last batch", "[loader]") {
  auto ten = std::make_shared<CountingDataset>(10);
  Loader keep(ten, {.batch_size = 4});
  REQUIRE(keep.batches_per_epoch() == 3);
  const std::vector<Batch> kept = collect(keep, 0);
  REQUIRE(sizes_of(kept) == std::vector<int64_t>{4, 4, 2});
  REQUIRE(kept[2].indices == std::vector<int64_t>{8, 9});
  REQUIRE(kept[2].input.shape() == Shape{2, 2, 3});

  Loader drop(ten, {.batch_size = 4, .drop_last = true, .workers = 2});
  REQUIRE(drop.batches_per_epoch() == 2);
  REQUIRE(sizes_of(collect(drop, 0)) == std::vector<int64_t>{4, 4});

  auto eight = std::make_shared<CountingDataset>(8);
  REQUIRE(Loader(eight, {.batch_size = 4}).batches_per_epoch() == 2);
  REQUIRE(Loader(eight, {.batch_size = 4, .drop_last = true}).batches_per_epoch() == 2);
  REQUIRE(Loader(eight, {.batch_size = 9, .drop_last = true}).batches_per_epoch() == 0);

  Loader empty_loader(std::make_shared<CountingDataset>(0), {.batch_size = 4, .workers = 2});
  REQUIRE(empty_loader.batches_per_epoch() == 0);
  REQUIRE(collect(empty_loader, 0).empty());
}

TEST_CASE("Loader epoch start resumes mid-epoch", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(19);
  for (int64_t workers : {0, 2}) {
    INFO(workers << " workers");
    Loader loader(dataset, {.batch_size = 3, .shuffle = true, .workers = workers, .seed = 5});
    const std::vector<Batch> all = collect(loader, 2);
    REQUIRE(all.size() == 7);
    const std::vector<Batch> tail = collect(loader, 2, 4);
    require_same_batches(tail, std::vector<Batch>(all.begin() + 4, all.end()));
    REQUIRE(collect(loader, 2, 7).empty());
    REQUIRE_THROWS_WITH(loader.epoch(2, 8), Catch::Contains("start batch 8 outside [0, 7]"));
    REQUIRE_THROWS_AS(loader.epoch(2, -1), Error);
    REQUIRE_THROWS_AS(loader.epoch(-1), Error);
  }
}

TEST_CASE("Loader skips and counts bad samples when asked", "[loader]") {
  // Batches of 4 over 10 samples: {0, 2, 3}, nothing (4 to 7 all bad, so skipped), {8, 9}.
  auto dataset = std::make_shared<CountingDataset>(10, std::set<int64_t>{1, 4, 5, 6, 7});
  for (int64_t workers : {0, 2}) {
    INFO(workers << " workers");
    Loader loader(dataset, {.batch_size = 4, .workers = workers, .skip_bad_samples = true});
    const std::vector<Batch> batches = collect(loader, 0);
    REQUIRE(batches.size() == 2);
    REQUIRE(batches[0].indices == std::vector<int64_t>{0, 2, 3});
    REQUIRE(batches[0].input.shape() == Shape{3, 2, 3});
    REQUIRE(testing::values(batches[0].target) == std::vector<double>{0, 2, 0});
    REQUIRE(batches[1].indices == std::vector<int64_t>{8, 9});
    REQUIRE(batches[1].index == 2);
    REQUIRE(loader.skipped() == 5);
    collect(loader, 1);
    REQUIRE(loader.skipped() == 10);
  }
}

TEST_CASE("Loader rethrows sample errors at their batch", "[loader]") {
  auto bad = std::make_shared<CountingDataset>(12, std::set<int64_t>{5});
  auto broken = std::make_shared<CountingDataset>(12, std::set<int64_t>{}, std::set<int64_t>{9});
  for (int64_t workers : {0, 3}) {
    INFO(workers << " workers");
    // Without skip_bad_samples a BadSample surfaces with its message, after the batches before it.
    Loader strict(bad, {.batch_size = 2, .workers = workers});
    int64_t served = 0;
    auto run_strict = [&] {
      for (Batch& batch : strict.epoch(0)) served += batch.size();
    };
    REQUIRE_THROWS_WITH(run_strict(), Catch::Contains("broken sample 5"));
    REQUIRE_THROWS_AS(run_strict(), Error);
    REQUIRE(served == 8);  // batches 0 and 1, twice
    REQUIRE(strict.skipped() == 0);

    // Other errors are never skipped.
    Loader lenient(broken, {.batch_size = 2, .workers = workers, .skip_bad_samples = true});
    REQUIRE_THROWS_WITH(collect(lenient, 0), Catch::Contains("disk on fire at 9"));

    // The error stops the pass: the loader still serves the next one.
    Loader clean(std::make_shared<CountingDataset>(6), {.batch_size = 2, .workers = workers});
    REQUIRE(collect(clean, 0).size() == 3);
  }
}

TEST_CASE("Loader stops its workers when the loop breaks early", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(400);
  Loader loader(dataset, {.batch_size = 2, .workers = 3, .prefetch = 2});
  {
    Loader::Epoch epoch = loader.epoch(0);
    Loader::Epoch moved = std::move(epoch);
    auto it = moved.begin();
    REQUIRE(it->index == 0);
    // Workers load at most workers * prefetch = 6 batches past the one the consumer waits
    // for (batch 1), so batches 0 to 6 at most: 14 samples.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE(dataset->calls.load() <= 14);
    REQUIRE(dataset->calls.load() >= 2);
  }  // destroying the epoch joins the workers; a hang here fails the test by timeout
  const int64_t calls = dataset->calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(dataset->calls.load() == calls);

  int64_t taken = 0;
  for (Batch& batch : loader.epoch(1)) {
    if (batch.index == 3) break;
    ++taken;
  }
  REQUIRE(taken == 3);
}

TEST_CASE("Loader rejects bad options and bad samples", "[loader]") {
  auto dataset = std::make_shared<CountingDataset>(4);
  REQUIRE_THROWS_WITH(Loader(nullptr, {}), Catch::Contains("null"));
  REQUIRE_THROWS_WITH(Loader(dataset, {.batch_size = 0}), Catch::Contains("batch_size 0"));
  REQUIRE_THROWS_WITH(Loader(dataset, {.workers = -1}), Catch::Contains("workers -1"));
  REQUIRE_THROWS_WITH(Loader(dataset, {.prefetch = 0}), Catch::Contains("prefetch 0"));

  Loader loader(dataset, {.batch_size = 2});
  Loader::Epoch epoch = loader.epoch(0);
  epoch.begin();
  REQUIRE_THROWS_WITH(epoch.begin(), Catch::Contains("single pass"));

  // A sample whose shape or label breaks the dataset's promise.
  class Liar : public CountingDataset {
   public:
    Liar(bool wrong_shape) : CountingDataset(4), wrong_shape_(wrong_shape) {}
    data::Sample get(int64_t index, data::SampleRng& rng) const override {
      data::Sample sample = CountingDataset::get(index, rng);
      if (wrong_shape_ && index == 2) sample.input = sample.input.reshape({3, 2});
      if (!wrong_shape_ && index == 3) sample.label = 3;
      return sample;
    }

   private:
    bool wrong_shape_;
  };
  for (int64_t workers : {0, 1}) {
    Loader shape_loader(std::make_shared<Liar>(true), {.batch_size = 4, .workers = workers});
    REQUIRE_THROWS_WITH(
        collect(shape_loader, 0),
        Catch::Contains("sample 2 is f32[3,2]") && Catch::Contains("sample_shape() is f32[2,3]"));
    Loader label_loader(std::make_shared<Liar>(false), {.batch_size = 4, .workers = workers});
    REQUIRE_THROWS_WITH(collect(label_loader, 0),
                        Catch::Contains("sample 3 has label 3, outside [0, 3)"));
  }
}
