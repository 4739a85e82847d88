// The Loader at the edges of its options: a batch size near INT64_MAX (whose arithmetic once
// overflowed: kiln-train --batch 9223372036854775807 died of a division by zero), and the
// bounds on workers and prefetch.
#include <cstdint>
#include <limits>

#include "data/loader.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

// Sample i is a [2] tensor {i, i}, label i % 2.
class Numbers : public data::Dataset {
 public:
  explicit Numbers(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  int64_t num_classes() const override { return 2; }
  std::vector<int64_t> sample_shape() const override { return {2}; }
  data::Sample get(int64_t index, data::SampleRng&) const override {
    const auto v = static_cast<float>(index);
    return {testing::f32s({v, v}, {2}), index % 2};
  }
  std::string describe() const override { return "numbers"; }

 private:
  int64_t size_;
};

}  // namespace

TEST_CASE("Loader: a batch size near INT64_MAX gives one batch of everything or none with drop_last",
          "[data][loader]") {
  const auto data = std::make_shared<Numbers>(5);
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (const int64_t workers : {0, 2}) {
    INFO("workers " << workers);
    data::Loader loader(data, {.batch_size = huge, .workers = workers});
    CHECK(loader.batches_per_epoch() == 1);
    int64_t batches = 0;
    for (data::Batch& batch : loader.epoch(0)) {
      ++batches;
      CHECK(batch.size() == 5);
      CHECK(batch.input.shape() == Shape{5, 2});
    }
    CHECK(batches == 1);
    data::Loader dropping(data, {.batch_size = huge, .drop_last = true, .workers = workers});
    CHECK(dropping.batches_per_epoch() == 0);
    for (data::Batch& batch : dropping.epoch(0)) FAIL("a batch of " << batch.size() << " samples");
  }
  CHECK(data::Loader(data, {.batch_size = huge - 1}).batches_per_epoch() == 1);
  CHECK(data::Loader(data, {.batch_size = 2}).batches_per_epoch() == 3);
  CHECK(data::Loader(data, {.batch_size = 2, .drop_last = true}).batches_per_epoch() == 2);
  CHECK(data::Loader(data, {.batch_size = 5, .drop_last = true}).batches_per_epoch() == 1);
}

TEST_CASE("Loader: workers and prefetch are bounded", "[data][loader]") {
  const auto data = std::make_shared<Numbers>(4);
  REQUIRE_THROWS_WITH(data::Loader(data, {.workers = data::kMaxLoaderWorkers + 1}),
                      Contains("workers 4097 must be between 0 and 4096"));
  REQUIRE_THROWS_WITH(data::Loader(data, {.workers = -1}), Contains("workers -1"));
  REQUIRE_THROWS_WITH(data::Loader(data, {.prefetch = std::numeric_limits<int64_t>::max()}),
                      Contains("prefetch 9223372036854775807 must be between 1 and 1024"));
  REQUIRE_THROWS_WITH(data::Loader(data, {.prefetch = 0}), Contains("prefetch 0"));
}
