#pragma once
// SampleRng: the random numbers of one sample's transforms. Each sample of each epoch gets
// its own Philox stream keyed by (loader seed, epoch, sample index), so a random crop or
// flip is the same whichever worker thread loads the sample and in whatever order: batches
// are identical for 0, 1 or 8 workers.
#include <cstdint>

namespace kiln::data {

class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index);
  // Uniform in [0, 1).
  double uniform();
  // Uniform in [low, high).
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Uniform integer in [0, n), n > 0.
  uint64_t below(uint64_t n);
  // 64 random bits.
  uint64_t bits();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace kiln::data
