#pragma once
// Generator: the state of kiln's random stream, a seed and an offset. A random op reserves
// one Philox counter per element (core/philox.h) and passes (seed, offset) to its
// kernel, so the same seed gives the same numbers on the CPU and on a GPU.
#include <cstdint>
#include <mutex>

namespace kiln {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  void set_offset(uint64_t offset);
  // Reserves n counters: the seed and the first counter, read together.
  struct Reservation {
    uint64_t seed, offset;
  };
  Reservation reserve(uint64_t n);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The generator random ops use unless given another.
Generator& default_generator();
// Seeds the default generator and restarts its stream.
void manual_seed(uint64_t seed);

}  // namespace kiln
