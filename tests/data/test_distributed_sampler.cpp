// The distributed sampler and the Loader's shards: W ranks together see one process's
// global batches, each rank a balanced contiguous slice, the same on every epoch's order.
#include <memory>

#include "testing.h"

using namespace kiln;

TEST_CASE("ranks' shards put together are one process's global batches", "[data]") {
  auto dataset = std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{.size = 23, .num_classes = 5,
                                                                                 .channels = 1, .image_size = 2});
  data::Loader single(dataset, {.batch_size = 7, .shuffle = true, .seed = 3});
  for (int64_t world : {2, 3}) {
    for (int64_t epoch : {0, 4}) {
      INFO(world << " ranks, epoch " << epoch);
      std::vector<std::vector<int64_t>> joined(4);
      std::vector<std::vector<double>> inputs(4);
      for (int64_t rank = 0; rank < world; ++rank) {
        data::DistributedSampler sampler(dataset->size(),
                                         {.batch_size = 7, .rank = rank, .world_size = world, .shuffle = true, .seed = 3});
        sampler.set_epoch(epoch);
        // 7, 7, 7 and the short 2, which cannot feed 3 ranks.
        REQUIRE(sampler.batches_per_epoch() == (world == 2 ? 4 : 3));
        data::Loader loader(dataset, {.batch_size = 7, .shuffle = true, .seed = 3, .rank = rank, .world_size = world});
        int64_t b = 0;
        for (data::Batch& batch : loader.epoch(epoch)) {
          REQUIRE(batch.indices == sampler.shard(b));
          CHECK(batch.global_size == static_cast<int64_t>(sampler.global_batch(b).size()));
          joined[static_cast<size_t>(b)].insert(joined[static_cast<size_t>(b)].end(), batch.indices.begin(),
                                                batch.indices.end());
          const std::vector<double> v = testing::values(batch.input);
          inputs[static_cast<size_t>(b)].insert(inputs[static_cast<size_t>(b)].end(), v.begin(), v.end());
          ++b;
        }
        CHECK(b == loader.batches_per_epoch());
      }
      int64_t b = 0;
      for (data::Batch& batch : single.epoch(epoch)) {
        if (batch.size() < world) break;  // a last batch with fewer samples than ranks is dropped
        CHECK(joined[static_cast<size_t>(b)] == batch.indices);
        CHECK(inputs[static_cast<size_t>(b)] == testing::values(batch.input));  // the same transforms
        ++b;
      }
      CHECK(b == data::sharded_batches(23, 7, world, false));
    }
  }
}

TEST_CASE("shard ranges are balanced and in rank order", "[data]") {
  CHECK(data::shard_range(5, 0, 3) == std::pair<int64_t, int64_t>{0, 2});
  CHECK(data::shard_range(5, 1, 3) == std::pair<int64_t, int64_t>{2, 4});
  CHECK(data::shard_range(5, 2, 3) == std::pair<int64_t, int64_t>{4, 5});
  CHECK(data::sharded_batches(23, 7, 3, false) == 3);  // the last 2 cannot feed 3 ranks
  CHECK(data::sharded_batches(23, 7, 2, false) == 4);
  CHECK(data::sharded_batches(23, 7, 2, true) == 3);
  REQUIRE_THROWS_WITH(data::DistributedSampler(10, {.batch_size = 2, .rank = 0, .world_size = 3}),
                      Catch::Contains("a global batch of 2 cannot give each of 3 ranks a sample"));
  REQUIRE_THROWS_WITH(data::DistributedSampler(10, {.batch_size = 4, .rank = 3, .world_size = 3}),
                      Catch::Contains("rank 3 of world_size 3"));
}
